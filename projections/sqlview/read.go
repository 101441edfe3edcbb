package sqlview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/projections"
)

// Page sizes of List and its Query are the projections package's, shared
// by every view.
const (
	DefaultLimit = projections.DefaultLimit
	MaxLimit     = projections.MaxLimit
)

// Query selects the views List returns (projections.Query).
type Query = projections.Query

// Get returns the view of sandbox id, or an error wrapping events.ErrNotFound.
func (v *View) Get(ctx context.Context, id string) (events.View, error) {
	if !viewID(id) {
		return events.View{}, fmt.Errorf("sandbox %q: %w", id, events.ErrNotFound)
	}
	view, err := scanRow(v.pool.QueryRow(ctx, `SELECT `+columns+` FROM torpor_sandboxes WHERE id = $1`, id))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return events.View{}, fmt.Errorf("sandbox %s: %w", id, events.ErrNotFound)
	case err != nil:
		return events.View{}, fmt.Errorf("get %s: %w", id, err)
	}
	return view, nil
}

// List returns the page of the views q selects in q's order, with the
// number it selects over all pages, as the KV view answers: the same
// pages, cursors (a KV cursor works here and back), totals and
// INVALID_ARGUMENT errors for a malformed cursor, label, phase, sort or
// limit, or a cursor of another sort. Ids are uuid v7, so the order of ids
// is the order of creation; ids compare the same under any of the usual
// collations (CockroachDB's and PostgreSQL's C compare bytes), names are
// compared in COLLATE "C", byte by byte, as the KV view does; the age in
// phase is phase_since, or updated_at where it is NULL, with its
// nanoseconds. The page and the total are two statements of one
// read-only transaction, so they agree.
func (v *View) List(ctx context.Context, q Query) (events.Page, error) {
	pq, err := q.Parse()
	if err != nil {
		return events.Page{}, err
	}
	var where strings.Builder
	where.WriteString(`TRUE`)
	var args []any
	arg := func(x any) string {
		args = append(args, x)
		return `$` + strconv.Itoa(len(args))
	}
	if pq.Phase != events.PhaseNone {
		where.WriteString(` AND phase = ` + arg(string(pq.Phase)))
	}
	if pq.LabelKey != "" {
		where.WriteString(` AND labels ->> ` + arg(pq.LabelKey) + ` = ` + arg(pq.LabelValue))
	}
	if pq.Name != "" {
		where.WriteString(` AND strpos(lower(name), ` + arg(pq.Name) + `) > 0`)
	}
	if pq.Driver != "" {
		where.WriteString(` AND driver = ` + arg(pq.Driver))
	}
	if pq.Node != "" {
		where.WriteString(` AND node = ` + arg(pq.Node))
	}
	filters, filterArgs := where.String(), slices.Clone(args)

	// The columns of the order, and the place of the cursor's view in it.
	var cols, place []string
	switch pq.Sort {
	case projections.SortName, projections.SortNameDesc:
		cols = []string{`name COLLATE "C"`, `id`}
		if pq.After != "" {
			place = []string{arg(pq.AfterName) + `::TEXT COLLATE "C"`, arg(pq.After) + `::TEXT`}
		}
	case projections.SortAge, projections.SortAgeDesc:
		cols = []string{`coalesce(phase_since, updated_at)`,
			`(CASE WHEN phase_since IS NULL THEN updated_at_nanos ELSE phase_since_nanos END)`, `id`}
		if pq.After != "" {
			at := time.Unix(0, pq.AfterTime).UTC()
			place = []string{arg(at.Truncate(time.Microsecond)) + `::TIMESTAMPTZ`,
				arg(int32(at.Nanosecond()%1000)) + `::INT4`, arg(pq.After) + `::TEXT`}
		}
	default:
		cols = []string{`id`}
		if pq.After != "" {
			place = []string{arg(pq.After) + `::TEXT`}
		}
	}
	past, dir := ` > `, ``
	if pq.Sort == projections.SortNameDesc || pq.Sort == projections.SortAgeDesc {
		past, dir = ` < `, ` DESC`
	}
	var sb strings.Builder
	sb.WriteString(`SELECT ` + columns + ` FROM torpor_sandboxes WHERE ` + filters)
	if place != nil {
		sb.WriteString(` AND (` + strings.Join(cols, `, `) + `)` + past + `(` + strings.Join(place, `, `) + `)`)
	}
	sb.WriteString(` ORDER BY ` + strings.Join(cols, dir+`, `) + dir)
	sb.WriteString(` LIMIT ` + arg(pq.Limit+1)) // one more than the page: is there a next one?
	query := sb.String()

	page := events.Page{Items: make([]events.View, 0, min(pq.Limit, 64))}
	err = v.readTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM torpor_sandboxes WHERE `+filters, filterArgs...).Scan(&page.Total); err != nil {
			return err
		}
		rs, err := tx.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			view, err := scanRow(rs)
			if err != nil {
				return err
			}
			if len(page.Items) == pq.Limit {
				page.Next = pq.Next(page.Items[pq.Limit-1])
				break
			}
			page.Items = append(page.Items, view)
		}
		return rs.Err()
	})
	if err != nil {
		return events.Page{}, fmt.Errorf("list: %w", err)
	}
	return page, nil
}

// readTx runs fn in a read-only transaction of one snapshot.
func (v *View) readTx(ctx context.Context, fn func(pgx.Tx) error) error {
	tx, err := v.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Counts returns how many sandboxes are in each phase; every phase of the
// contract is present, zero or not.
func (v *View) Counts(ctx context.Context) (map[events.Phase]int, error) {
	counts := make(map[events.Phase]int, len(events.Phases))
	for _, p := range events.Phases {
		counts[p] = 0
	}
	rs, err := v.pool.Query(ctx, `SELECT phase, count(*) FROM torpor_sandboxes GROUP BY phase`)
	if err != nil {
		return nil, fmt.Errorf("counts: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		var phase string
		var n int64
		if err := rs.Scan(&phase, &n); err != nil {
			return nil, fmt.Errorf("counts: %w", err)
		}
		counts[events.Phase(phase)] += int(n)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("counts: %w", err)
	}
	return counts, nil
}

// History returns the events of sandbox id above seq after from
// torpor_history, in log order, as the log's envelopes (Seq set). Data is
// the same JSON, as JSONB gives it back: keys sorted, no spaces. A sandbox
// without events yields an empty slice, as the store's Load does.
func (v *View) History(ctx context.Context, id string, after uint64) ([]events.Envelope, error) {
	rs, err := v.pool.Query(ctx, `SELECT seq, type, "time", time_nanos, actor, command_id, correlation_id, data,
  event_id, causation_id, phase FROM torpor_history WHERE sandbox_id = $1 AND seq > $2 ORDER BY seq`, id, int64(after))
	if err != nil {
		return nil, fmt.Errorf("history %s: %w", id, err)
	}
	defer rs.Close()
	out := []events.Envelope{}
	for rs.Next() {
		var (
			env   = events.Envelope{SandboxID: id, Schema: events.SchemaVersion}
			seq   int64
			at    time.Time
			nanos int32
			data  []byte
			phase string
		)
		if err := rs.Scan(&seq, &env.Type, &at, &nanos, &env.Actor, &env.CommandID, &env.CorrelationID, &data,
			&env.ID, &env.CausationID, &phase); err != nil {
			return nil, fmt.Errorf("history %s: %w", id, err)
		}
		env.Seq, env.Phase, env.Data = uint64(seq), events.Phase(phase), data
		env.Time = at.UTC().Add(time.Duration(nanos))
		out = append(out, env)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("history %s: %w", id, err)
	}
	return out, nil
}
