// Package sqlview keeps the phase view of every sandbox, and the audit
// history, in tables of CockroachDB or PostgreSQL (CONTRACT §6), for
// dashboards and auditors that query SQL. It is a projection for the
// projections runner and a reader that answers as the KV view does.
//
// It speaks the PostgreSQL wire protocol with a pgx pool and runs every
// transaction through cockroach-go's retry helper, in SQL both databases
// accept (INSERT … ON CONFLICT, never UPSERT; no PL/pgSQL).
package sqlview

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/torpor/torpor/events"
)

// DefaultName is the view's name in torpor_checkpoints and torpor_parked.
const DefaultName = "sqlview"

// Config says what the view is called. Its schema is deploy/sql's.
type Config struct {
	// Name keys the view's checkpoint and parked events; default
	// DefaultName. Two writers of one name are one view, taking turns on
	// its checkpoint.
	Name string
	// TxAttempts bounds how often a batch's transaction starts afresh after
	// a serialization failure (40001) or a deadlock (40P01) before
	// ApplyBatch gives the error to the runner; default 10.
	TxAttempts int
	// Now is the clock that dates the tables of the past (ReapPast);
	// default time.Now.
	Now func() time.Time
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.TxAttempts < 0:
		return fmt.Errorf("tx attempts %d: must not be negative", c.TxAttempts)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.TxAttempts == 0 {
		c.TxAttempts = 10
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// View is the SQL view on one database. ApplyBatch is meant for one writer
// (the runner) but stays correct with several (see ApplyBatch); the readers
// are safe for any number of goroutines.
type View struct {
	pool  *pgxpool.Pool
	owned bool // Close closes pool
	cfg   Config

	applied atomic.Uint64 // events folded into a row, in committed transactions
	parked  atomic.Uint64 // rows of this view in torpor_parked
	retries atomic.Uint64 // transaction attempts undone by a serialization failure
}

// Open connects to the database at url (a PostgreSQL URL or keyword/value
// string, which CockroachDB's are too) and opens the view there as New
// does. A url that does not parse is an INVALID_ARGUMENT error. Close
// closes the pool.
func Open(ctx context.Context, url string, cfg Config) (*View, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, events.Errorf(events.CodeInvalidArgument, "sql view: database url: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, events.Errorf(events.CodeInvalidArgument, "sql view: database url: %w", err)
	}
	v, err := New(ctx, pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	v.owned = true
	return v, nil
}

// New opens the view on pool: it applies the migrations the database lacks
// (see Migrate) and makes sure the view's checkpoint row exists. A
// database whose schema is newer than this build's is refused with a
// FAILED_PRECONDITION error. The pool stays the caller's.
func New(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*View, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sql view: %w", err)
	}
	v := &View{pool: pool, cfg: cfg.withDefaults()}
	if err := v.migrate(ctx); err != nil {
		return nil, fmt.Errorf("sql view: %w", err)
	}
	var n int64
	err := v.pool.QueryRow(ctx, `SELECT count(*) FROM torpor_parked WHERE view = $1`, v.cfg.Name).Scan(&n)
	if err != nil {
		return nil, fmt.Errorf("sql view: count parked: %w", err)
	}
	v.parked.Store(uint64(n))
	return v, nil
}

// Close closes the pool if Open made it.
func (v *View) Close() {
	if v.owned {
		v.pool.Close()
	}
}

// Name is the projection's name, in the runner's logs and errors.
func (v *View) Name() string { return v.cfg.Name }

// Checkpoint is the highest seq the view holds (projections.Checkpointer),
// written in the transaction of the rows it covers.
func (v *View) Checkpoint(ctx context.Context) (uint64, error) {
	var seq int64
	err := v.pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM torpor_checkpoints WHERE view = $1`, v.cfg.Name).Scan(&seq)
	if err != nil {
		return 0, fmt.Errorf("checkpoint %s: %w", v.cfg.Name, err)
	}
	return uint64(seq), nil
}

// Parked is how many events of this view torpor_parked holds: events it
// could not apply and went on without.
func (v *View) Parked() uint64 { return v.parked.Load() }

// Applied is how many events this View folded into a row, in transactions
// that committed: each event is folded once across all writers of the
// view, whatever was delivered again.
func (v *View) Applied() uint64 { return v.applied.Load() }

// Retries is how many transaction attempts a serialization failure or a
// deadlock undid and this View ran again.
func (v *View) Retries() uint64 { return v.retries.Load() }
