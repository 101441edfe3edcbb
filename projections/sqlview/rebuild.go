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
	"golang.org/x/sync/errgroup"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/projections"
)

// Rebuild with a swap (CONTRACT §6: "a rebuild swaps new tables in under
// the same names"). The live tables keep serving, and the live projection
// keeps applying, until one transaction puts the rebuilt tables in their
// place:
//
//  1. fold: create torpor_sandboxes_rebuild_<n> and torpor_history_rebuild_<n>
//     (LIKE the live tables, INCLUDING ALL) and their checkpoint row
//     (torpor_checkpoints, view "<name>.rebuild_<n>"); read the log from the
//     start (Replay), fold every sandbox's row in memory with the live view's
//     fold, and stream each event's history row into the new history table
//     (one COPY, fed while the log is read);
//  2. write: the folded rows go into the new sandboxes table (one COPY), and
//     their checkpoint is the last sequence read;
//  3. catchup: the events appended meanwhile are read from that checkpoint
//     on, folded into the rows kept in memory and written to the new tables
//     (upserts that only raise a row's seq, the new checkpoint in the same
//     transaction), round after round until a round finds few;
//  4. swap, in one transaction (through crdbpgx.ExecuteTx):
//     a. lock the live view's checkpoint row (SELECT … FOR UPDATE): from
//     here on no live writer can commit a batch, since every batch locks
//     that row first and writes it last;
//     b. if the live checkpoint is above the new tables' (the live writer
//     applied events the last round did not read), catch the new tables up
//     once more, on another connection (the log's head is at or above the
//     live checkpoint, so one round is enough);
//     c. rename the live tables away, the new ones to the contract's names,
//     drop the old ones and give the new indexes the old indexes' names;
//     d. set the live checkpoint row to the new tables' checkpoint (always
//     written, even when equal, so that a live batch waiting on the row
//     fails to serialize rather than going on with a snapshot from before
//     the swap).
//
// How the live projection continues: its runner holds a position P at or
// below the live checkpoint C, and the swap leaves the tables holding every
// event up to S ≥ C, with checkpoint S. A live batch that was waiting on
// the row lock fails with a serialization failure (40001) when the swap
// commits, and runs again in a new transaction (see tx), which reads the
// checkpoint S and resolves the table names to the swapped-in tables; it
// skips every event at or below S (ApplyBatch skips what the checkpoint
// covers) and applies the rest. So no event is lost (the new tables hold
// all up to S, the live writer applies all above S) and none is applied
// twice (below S the checkpoint skips it, above S only the live writer
// writes). Readers never see a missing sandbox: before the commit they read
// the old tables, after it the new ones, which hold every sandbox the old
// ones held at a seq at or above theirs (S ≥ C); a reader's statement that
// meets the renaming waits for the commit and then reads the new table.
//
// A rebuild into tables of the past (RebuildOptions.Until or UntilTime, of
// package projections, whose log, phases and progress every view shares)
// folds the log up to that sequence into torpor_sandboxes_at_<seq> and
// torpor_history_at_<seq>, for audit beside the live tables; they are never
// swapped in, and a second build of the same sequence is ALREADY_EXISTS.
// When they were made is recorded in torpor_past, for ReapPast.
//
// A rebuild that fails or is cancelled drops its tables: the live ones are
// untouched. Events the rebuild cannot apply are parked under the live
// view's name, where the live view parked them already (ON CONFLICT DO
// NOTHING).

// RebuildStats say what a rebuild did.
type RebuildStats struct {
	// Events is how many events were read from the log.
	Events int
	// Rows is how many rows the sandboxes table holds.
	Rows int
	// LastSeq is the sequence the tables hold.
	LastSeq uint64
	// Sandboxes and History are the tables' names when the rebuild ended:
	// the contract's after a swap, the _at_<seq> ones for the past.
	Sandboxes, History string
	// Fold, Write, CatchUp and Swap are the times the phases took.
	Fold, Write, CatchUp, Swap time.Duration
}

// catchUpFew is the number of events below which a catch-up round is the
// last before the swap.
const catchUpFew = 1000

// build is one rebuild's state.
type build struct {
	v                  *View
	sandboxes, history string // the new tables
	cp                 string // the new tables' checkpoint row
	views              map[string]events.View
	last               uint64 // the log is folded up to here
	events             int
	parked             parked
	progress           func(projections.Progress)
}

// Rebuild rebuilds the view from src (see the protocol above): into new
// tables swapped in under the contract's names, or with opts.Until or
// opts.UntilTime, into tables of the past, never swapped in. An Until past
// the log's last sequence, or a time before its first event, is
// INVALID_ARGUMENT.
func (v *View) Rebuild(ctx context.Context, src projections.Log, opts projections.RebuildOptions) (st RebuildStats, err error) {
	head, err := src.LastSeq(ctx)
	if err != nil {
		return st, fmt.Errorf("rebuild: %w", err)
	}
	past := opts.Until != 0 || !opts.UntilTime.IsZero()
	if opts.Until > head {
		return st, events.Errorf(events.CodeInvalidArgument, "rebuild until %d: the log ends at %d", opts.Until, head)
	}
	if opts.Until != 0 {
		if err := v.pastFree(ctx, opts.Until); err != nil {
			return st, err
		}
	}
	suffix := "rebuild_" + strconv.FormatInt(time.Now().UnixNano(), 10)
	b := &build{v: v, sandboxes: "torpor_sandboxes_" + suffix, history: "torpor_history_" + suffix,
		cp: v.cfg.Name + "." + suffix, views: map[string]events.View{}, progress: opts.Progress}
	if b.progress == nil {
		b.progress = func(projections.Progress) {}
	}
	kept := false
	defer func() {
		if !kept {
			b.drop()
		}
	}()
	if err := b.create(ctx); err != nil {
		return st, fmt.Errorf("rebuild: %w", err)
	}

	start := time.Now()
	until := opts.Until
	total := head
	if until != 0 {
		total = until
	}
	if err := b.fold(ctx, src, until, opts.UntilTime, total); err != nil {
		return st, fmt.Errorf("rebuild: fold: %w", err)
	}
	if past && opts.Until == 0 {
		if b.last == 0 {
			return st, events.Errorf(events.CodeInvalidArgument, "rebuild until %s: no event of the log is that old",
				opts.UntilTime.Format(time.RFC3339Nano))
		}
		until = b.last
	}
	if until != 0 {
		b.last = until
	}
	st.Fold = time.Since(start)

	start = time.Now()
	b.progress(projections.Progress{Phase: projections.PhaseWrite, Done: b.last, Total: total})
	if st.Rows, err = b.writeRows(ctx); err != nil {
		return st, fmt.Errorf("rebuild: write: %w", err)
	}
	if !past && len(b.parked.seq) > 0 {
		if _, err := v.pool.Exec(ctx, insertParked, b.parked.args(v.cfg.Name)...); err != nil {
			return st, fmt.Errorf("rebuild: write parked: %w", err)
		}
	}
	if _, err := v.pool.Exec(ctx, `UPDATE torpor_checkpoints SET seq = $2 WHERE view = $1`, b.cp, int64(b.last)); err != nil {
		return st, fmt.Errorf("rebuild: write checkpoint: %w", err)
	}
	st.Write = time.Since(start)

	if past {
		if err := b.keepAsPast(ctx, until); err != nil {
			return st, err
		}
		kept = true
		st.Events, st.LastSeq, st.Sandboxes, st.History = b.events, b.last, b.sandboxes, b.history
		b.progress(projections.Progress{Phase: projections.PhaseDone, Done: b.last, Total: total})
		return st, nil
	}

	start = time.Now()
	rounds := opts.CatchUpRounds
	if rounds <= 0 {
		rounds = 5
	}
	for range rounds {
		n, err := b.catchUp(ctx, src)
		if err != nil {
			return st, fmt.Errorf("rebuild: catch up: %w", err)
		}
		if n < catchUpFew {
			break
		}
	}
	st.CatchUp = time.Since(start)

	start = time.Now()
	if err := b.swap(ctx, src); err != nil {
		return st, fmt.Errorf("rebuild: swap: %w", err)
	}
	kept = true
	st.Swap = time.Since(start)
	if _, err := v.pool.Exec(ctx, `DELETE FROM torpor_checkpoints WHERE view = $1`, b.cp); err != nil {
		return st, fmt.Errorf("rebuild: drop the rebuild's checkpoint: %w", err)
	}
	var n int64
	if err := v.pool.QueryRow(ctx, `SELECT count(*) FROM torpor_parked WHERE view = $1`, v.cfg.Name).Scan(&n); err == nil {
		v.parked.Store(uint64(n))
	}
	st.Events, st.LastSeq, st.Sandboxes, st.History = b.events, b.last, "torpor_sandboxes", "torpor_history"
	b.progress(projections.Progress{Phase: projections.PhaseDone, Done: b.last, Total: b.last})
	return st, nil
}

// PastTables are the names of the tables of the past at seq.
func PastTables(seq uint64) (sandboxes, history string) {
	return "torpor_sandboxes_at_" + strconv.FormatUint(seq, 10), "torpor_history_at_" + strconv.FormatUint(seq, 10)
}

// pastFree returns ALREADY_EXISTS when the tables of the past at seq exist.
func (v *View) pastFree(ctx context.Context, seq uint64) error {
	s, h := PastTables(seq)
	var n int
	err := v.pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables
WHERE table_schema = current_schema() AND table_name IN ($1, $2)`, s, h).Scan(&n)
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	if n > 0 {
		return events.Errorf(events.CodeAlreadyExists, "the view at seq %d exists already: %s", seq, s)
	}
	return nil
}

// create makes the new tables, like the live ones, and their checkpoint row.
func (b *build) create(ctx context.Context) error {
	for _, t := range [][2]string{{b.sandboxes, "torpor_sandboxes"}, {b.history, "torpor_history"}} {
		q := `CREATE TABLE ` + ident(t[0]) + ` (LIKE ` + ident(t[1]) + ` INCLUDING ALL)`
		if _, err := b.v.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("create %s: %w", t[0], err)
		}
	}
	_, err := b.v.pool.Exec(ctx, `INSERT INTO torpor_checkpoints (view, seq) VALUES ($1, 0) ON CONFLICT (view) DO NOTHING`, b.cp)
	if err != nil {
		return fmt.Errorf("checkpoint row %s: %w", b.cp, err)
	}
	return nil
}

// drop removes what a failed rebuild left.
func (b *build) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = b.v.pool.Exec(ctx, `DROP TABLE IF EXISTS `+ident(b.sandboxes))
	_, _ = b.v.pool.Exec(ctx, `DROP TABLE IF EXISTS `+ident(b.history))
	_, _ = b.v.pool.Exec(ctx, `DELETE FROM torpor_checkpoints WHERE view = $1`, b.cp)
}

// fold reads the log from the start (up to until, or to the first event
// after untilTime, when set) and folds it into b.views, while one COPY
// writes the history rows into the new history table.
func (b *build) fold(ctx context.Context, src projections.Log, until uint64, untilTime time.Time, total uint64) error {
	g, gctx := errgroup.WithContext(ctx)
	chunks := make(chan []events.Envelope, 8)
	hist := make(chan history, 8)
	g.Go(func() error {
		_, err := b.v.pool.CopyFrom(gctx, pgx.Identifier{b.history}, historyColumns, &historySource{ctx: gctx, ch: hist})
		if err != nil {
			return fmt.Errorf("copy history: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		defer close(hist)
		for chunk := range chunks {
			p := fold(0, b.views, chunk)
			b.events += len(chunk)
			b.last = max(b.last, p.top)
			b.parked.seq = append(b.parked.seq, p.parked.seq...)
			b.parked.sandbox = append(b.parked.sandbox, p.parked.sandbox...)
			b.parked.typ = append(b.parked.typ, p.parked.typ...)
			b.parked.reason = append(b.parked.reason, p.parked.reason...)
			b.parked.data = append(b.parked.data, p.parked.data...)
			select {
			case hist <- p.history:
			case <-gctx.Done():
				return gctx.Err()
			}
			b.progress(projections.Progress{Phase: projections.PhaseFold, Done: b.last, Total: total})
		}
		return nil
	})
	g.Go(func() error {
		defer close(chunks)
		_, _, err := projections.ReplayUntil(gctx, src, until, untilTime, chunks)
		return err
	})
	return g.Wait()
}

// historyColumns are torpor_history's columns in historySource's order.
var historyColumns = []string{"seq", "sandbox_id", "type", "time", "time_nanos", "actor", "command_id",
	"correlation_id", "data", "event_id", "causation_id", "phase"}

// historySource feeds a COPY the history rows that come on ch, until it is
// closed.
type historySource struct {
	ctx context.Context
	ch  <-chan history
	cur history
	i   int
	err error
}

func (s *historySource) Next() bool {
	for s.i >= len(s.cur.seq) {
		select {
		case h, ok := <-s.ch:
			if !ok {
				return false
			}
			s.cur, s.i = h, 0
		case <-s.ctx.Done():
			s.err = s.ctx.Err()
			return false
		}
	}
	s.i++
	return true
}

func (s *historySource) Values() ([]any, error) {
	h, i := &s.cur, s.i-1
	var data any
	if h.data[i] != nil {
		data = *h.data[i]
	}
	return []any{h.seq[i], h.sandbox[i], h.typ[i], h.at[i], h.nanos[i], h.actor[i], h.command[i],
		h.correlation[i], data, h.id[i], h.cause[i], h.phase[i]}, nil
}

func (s *historySource) Err() error { return s.err }

// sandboxColumns are torpor_sandboxes' columns in writeRows' order.
var sandboxColumns = strings.Split(strings.Join(strings.Fields(columns), ""), ",")

// writeRows copies every folded row into the new sandboxes table.
func (b *build) writeRows(ctx context.Context) (int, error) {
	var r rows
	for _, view := range b.views {
		if err := r.add(view); err != nil {
			return 0, err
		}
	}
	str := func(p *string) any {
		if p == nil {
			return nil
		}
		return *p
	}
	n, err := b.v.pool.CopyFrom(ctx, pgx.Identifier{b.sandboxes}, sandboxColumns, pgx.CopyFromSlice(len(r.id), func(i int) ([]any, error) {
		var exit any
		if r.exit[i] != nil {
			exit = *r.exit[i]
		}
		var since any
		if r.since[i] != nil {
			since = *r.since[i]
		}
		var active any
		if r.active[i] != nil {
			active = *r.active[i]
		}
		return []any{r.id[i], r.name[i], r.phase[i], r.generation[i], r.driver[i], r.node[i], str(r.labels[i]),
			r.restore[i], r.outcome[i], exit, r.reason[i], r.at[i], r.nanos[i], r.seq[i], str(r.forwards[i]),
			since, r.sinceNanos[i], str(r.expiry[i]), active, r.activeNanos[i],
			r.wake[i],
			str(r.idle[i])}, nil
	}))
	if err != nil {
		return 0, fmt.Errorf("copy rows: %w", err)
	}
	return int(n), nil
}

// catchUp folds the events after b.last into the new tables, a transaction
// per chunk of the log, and returns how many it read.
func (b *build) catchUp(ctx context.Context, src projections.Log) (int, error) {
	total, err := src.LastSeq(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	upsert := strings.ReplaceAll(upsertRows, "torpor_sandboxes", ident(b.sandboxes))
	insert := strings.ReplaceAll(insertHistory, "torpor_history", ident(b.history))
	last, err := src.Replay(ctx, b.last+1, func(envs []events.Envelope) error {
		p := fold(b.last, b.views, envs)
		err := b.v.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			batch := &pgx.Batch{}
			if len(p.rows.id) > 0 {
				batch.Queue(upsert, p.rows.args()...)
			}
			if len(p.history.seq) > 0 {
				batch.Queue(insert, p.history.args()...)
			}
			if len(p.parked.seq) > 0 {
				batch.Queue(insertParked, p.parked.args(b.v.cfg.Name)...)
			}
			batch.Queue(`UPDATE torpor_checkpoints SET seq = $2 WHERE view = $1`, b.cp, int64(p.top))
			return tx.SendBatch(ctx, batch).Close()
		})
		if err != nil {
			return err
		}
		n += len(envs)
		b.events += len(envs)
		b.last = max(b.last, p.top)
		b.progress(projections.Progress{Phase: projections.PhaseCatchUp, Done: b.last, Total: max(total, b.last)})
		return nil
	})
	if err != nil {
		return n, err
	}
	if last > b.last { // the log ends with messages that are not events
		b.last = last
		_, err = b.v.pool.Exec(ctx, `UPDATE torpor_checkpoints SET seq = $2 WHERE view = $1`, b.cp, int64(last))
	}
	return n, err
}

// rename is one index to give the name it had on the live table.
type rename struct{ from, to string }

// indexRenames pairs each index of the live table with the new table's
// index of the same definition.
func (b *build) indexRenames(ctx context.Context) ([]rename, error) {
	read := func(table string) (map[string]string, error) {
		rs, err := b.v.pool.Query(ctx, `SELECT indexname, indexdef FROM pg_indexes
WHERE schemaname = current_schema() AND tablename = $1`, table)
		if err != nil {
			return nil, err
		}
		defer rs.Close()
		out := map[string]string{} // definition → name
		for rs.Next() {
			var name, def string
			if err := rs.Scan(&name, &def); err != nil {
				return nil, err
			}
			out[indexShape(def)] = name
		}
		return out, rs.Err()
	}
	var out []rename
	for _, t := range [][2]string{{"torpor_sandboxes", b.sandboxes}, {"torpor_history", b.history}} {
		live, err := read(t[0])
		if err != nil {
			return nil, fmt.Errorf("indexes of %s: %w", t[0], err)
		}
		fresh, err := read(t[1])
		if err != nil {
			return nil, fmt.Errorf("indexes of %s: %w", t[1], err)
		}
		for shape, name := range live {
			if from, ok := fresh[shape]; ok && from != name {
				out = append(out, rename{from: from, to: name})
			}
		}
	}
	return out, nil
}

// indexShape is an index definition without its name and table:
// "CREATE UNIQUE INDEX n ON s.t USING btree (id)" is "UNIQUE USING btree (id)".
func indexShape(def string) string {
	f := strings.Fields(def)
	for i, w := range f {
		if w == "ON" && i+1 < len(f) {
			rest := f[i+2:]
			if f[i+1] == "ONLY" && i+2 < len(f) {
				rest = f[i+3:]
			}
			unique := ""
			if slices.Contains(f[:i], "UNIQUE") {
				unique = "UNIQUE "
			}
			return unique + strings.Join(rest, " ")
		}
	}
	return def
}

// swap puts the new tables in place of the live ones in one transaction.
func (b *build) swap(ctx context.Context, src projections.Log) error {
	renames, err := b.indexRenames(ctx)
	if err != nil {
		return err
	}
	suffix := strings.TrimPrefix(b.sandboxes, "torpor_sandboxes_rebuild_")
	// READ COMMITTED: the lock on the live checkpoint row waits for the
	// live batch that holds it and then reads what it committed. At
	// SERIALIZABLE, PostgreSQL fails a lock that waited on a row changed
	// since the transaction's snapshot (40001), and a live writer that
	// keeps committing batches would fail every attempt. Nothing else in
	// the transaction reads: the renames and the checkpoint's update rest
	// on that lock. (CockroachDB without read committed enabled runs it
	// SERIALIZABLE, where the waiting lock moves the transaction's
	// timestamp instead.)
	return b.v.txAt(ctx, pgx.ReadCommitted, func(ctx context.Context, tx pgx.Tx) error {
		var live int64
		err := tx.QueryRow(ctx, `SELECT seq FROM torpor_checkpoints WHERE view = $1 FOR UPDATE`, b.v.cfg.Name).Scan(&live)
		if err != nil {
			return fmt.Errorf("lock the live checkpoint: %w", err)
		}
		b.progress(projections.Progress{Phase: projections.PhaseSwap, Done: b.last, Total: max(b.last, uint64(live))})
		if uint64(live) > b.last {
			if _, err := b.catchUp(ctx, src); err != nil {
				return fmt.Errorf("catch up to the live checkpoint %d: %w", live, err)
			}
			if uint64(live) > b.last {
				return fmt.Errorf("the live view is at seq %d, beyond the log's %d", live, b.last)
			}
		}
		stmts := []string{}
		for _, t := range [][2]string{{"torpor_sandboxes", b.sandboxes}, {"torpor_history", b.history}} {
			gone := t[0] + "_old_" + suffix
			stmts = append(stmts,
				`ALTER TABLE `+ident(t[0])+` RENAME TO `+ident(gone),
				`ALTER TABLE `+ident(t[1])+` RENAME TO `+ident(t[0]),
				`DROP TABLE `+ident(gone))
		}
		for _, r := range renames {
			stmts = append(stmts, `ALTER INDEX `+ident(r.from)+` RENAME TO `+ident(r.to))
		}
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		_, err = tx.Exec(ctx, `UPDATE torpor_checkpoints SET seq = $2 WHERE view = $1`, b.v.cfg.Name, int64(b.last))
		return err
	})
}

// keepAsPast renames the new tables to those of the past at seq, unless
// they exist (ALREADY_EXISTS), and drops their checkpoint row.
func (b *build) keepAsPast(ctx context.Context, seq uint64) error {
	s, h := PastTables(seq)
	err := b.v.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var n int
		err := tx.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables
WHERE table_schema = current_schema() AND table_name IN ($1, $2)`, s, h).Scan(&n)
		if err != nil {
			return err
		}
		if n > 0 {
			return events.Errorf(events.CodeAlreadyExists, "the view at seq %d exists already: %s", seq, s)
		}
		for _, q := range []string{
			`ALTER TABLE ` + ident(b.sandboxes) + ` RENAME TO ` + ident(s),
			`ALTER TABLE ` + ident(b.history) + ` RENAME TO ` + ident(h),
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO torpor_past (seq, made_at) VALUES ($1, $2)
ON CONFLICT (seq) DO UPDATE SET made_at = excluded.made_at`, int64(seq), b.v.cfg.Now().UTC()); err != nil {
			return fmt.Errorf("record the view at seq %d: %w", seq, err)
		}
		_, err = tx.Exec(ctx, `DELETE FROM torpor_checkpoints WHERE view = $1`, b.cp)
		return err
	})
	if err != nil {
		var e *events.Error
		if errors.As(err, &e) {
			return err
		}
		return fmt.Errorf("rebuild: keep the view at seq %d: %w", seq, err)
	}
	b.sandboxes, b.history = s, h
	return nil
}

// ident quotes a table or index name.
func ident(name string) string { return pgx.Identifier{name}.Sanitize() }
