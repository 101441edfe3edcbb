package sqlview

import (
	"context"
	"errors"
	"fmt"
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

// List returns the views q selects in creation order, with the KV view's
// answers: the same pages, cursors (a KV cursor works here and back) and
// INVALID_ARGUMENT errors for a malformed cursor, label, phase or limit.
// Ids are uuid v7, so the order of ids is the order of creation; the rows
// come ORDER BY id, which for such ids is the byte order the KV view sorts
// by under any of the usual collations (CockroachDB's and PostgreSQL's C
// compare bytes).
func (v *View) List(ctx context.Context, q Query) (events.Page, error) {
	pq, err := q.Parse()
	if err != nil {
		return events.Page{}, err
	}
	after, lk, lv, limit := pq.After, pq.LabelKey, pq.LabelValue, pq.Limit

	var sb strings.Builder
	sb.WriteString(`SELECT ` + columns + ` FROM torpor_sandboxes WHERE id > $1`)
	args := []any{after}
	if q.Phase != events.PhaseNone {
		args = append(args, string(q.Phase))
		sb.WriteString(` AND phase = $` + strconv.Itoa(len(args)))
	}
	if lk != "" {
		args = append(args, lk, lv)
		fmt.Fprintf(&sb, ` AND labels ->> $%d = $%d`, len(args)-1, len(args))
	}
	args = append(args, limit+1) // one more than the page: is there a next one?
	sb.WriteString(` ORDER BY id LIMIT $` + strconv.Itoa(len(args)))

	rs, err := v.pool.Query(ctx, sb.String(), args...)
	if err != nil {
		return events.Page{}, fmt.Errorf("list: %w", err)
	}
	defer rs.Close()
	page := events.Page{Items: make([]events.View, 0, min(limit, 64))}
	for rs.Next() {
		view, err := scanRow(rs)
		if err != nil {
			return events.Page{}, fmt.Errorf("list: %w", err)
		}
		if len(page.Items) == limit {
			page.Next = projections.Cursor(page.Items[limit-1].ID)
			break
		}
		page.Items = append(page.Items, view)
	}
	if err := rs.Err(); err != nil {
		return events.Page{}, fmt.Errorf("list: %w", err)
	}
	return page, nil
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
