package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/projections"
	"github.com/torpor/torpor/projections/sqlview"
	"github.com/torpor/torpor/services/gateway"
)

// maxViewLag is how many events of the log a view may have yet to apply
// while /readyz still says ready.
const maxViewLag = 1000

// Waits of the SQL view on its database: the first attempt to reach it at
// start, a readiness probe's, and the backoff between attempts to open it
// after that (which the runner's own retries of a failed batch share).
const (
	sqlOpenTimeout  = 5 * time.Second
	sqlProbeTimeout = 2 * time.Second
	sqlMinBackoff   = 50 * time.Millisecond
	sqlMaxBackoff   = 5 * time.Second
)

// sqlPart is the SQL view of --projection-db: projections/sqlview on its
// own projections.Runner, over the same shared reading of the log as the KV
// view.
//
// A database that cannot be reached never stops the service. At start,
// only a malformed URL (INVALID_ARGUMENT) or a schema newer than this
// build's (FAILED_PRECONDITION) refuse it; a database that does not answer
// within sqlOpenTimeout, or refuses for any other reason, lets the service
// start without it, and Run keeps trying to open the view in the
// background, with backoff. A database that goes away later makes the
// runner retry its batch, with backoff, for as long as it takes: the view
// lags, never skips, and catches up from its checkpoint when the database
// returns. Meanwhile Ready says how far behind it is and why.
type sqlPart struct {
	url    string
	log    zerolog.Logger
	parked *metrics.Counter // torpor_parked_events_total{view="sql"}; set before attach

	mu     sync.Mutex
	src    sharedStore
	view   *sqlview.View       // nil until the database was reached
	runner *projections.Runner // nil until view and src are both there
	err    error               // the last failure to reach or write the database; nil after a success
}

// openSQL opens the SQL view at url, or returns it unopened when its
// database cannot be reached now (see sqlPart).
func openSQL(ctx context.Context, url string, log zerolog.Logger) (*sqlPart, error) {
	p := &sqlPart{url: url, log: log}
	if err := p.open(ctx); err != nil && refused(err) {
		return nil, err
	}
	return p, nil
}

// refused is an error of opening the view that waiting will not cure: a
// URL that does not parse, a schema newer than this build's.
func refused(err error) bool {
	switch events.CodeOf(err) {
	case events.CodeInvalidArgument, events.CodeFailedPrecondition:
		return true
	}
	return false
}

// open opens the view unless it is open; a failure is what Ready reports.
func (p *sqlPart) open(ctx context.Context) error {
	p.mu.Lock()
	open := p.view != nil
	p.mu.Unlock()
	if open {
		return nil
	}
	octx, cancel := context.WithTimeout(ctx, sqlOpenTimeout)
	defer cancel()
	v, err := sqlview.Open(octx, p.url, sqlview.Config{})
	if err != nil {
		err = fmt.Errorf("database not reached: %w", err)
		p.note(err)
		return err
	}
	p.mu.Lock()
	p.view, p.err = v, nil
	p.mu.Unlock()
	return p.follow()
}

// attach has the view follow src (now, or once it is open).
func (p *sqlPart) attach(src sharedStore) error {
	p.mu.Lock()
	p.src = src
	p.mu.Unlock()
	return p.follow()
}

// follow makes the view's runner once the view and the log are both there.
func (p *sqlPart) follow() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.view == nil || p.src.Store == nil || p.runner != nil {
		return nil
	}
	r, err := projections.NewRunner(p.src, watched{View: p.view, p: p}, projections.Config{
		Attempts: 1 << 30, MinBackoff: sqlMinBackoff, MaxBackoff: sqlMaxBackoff, Logger: p.log, Parked: p.parked,
	})
	if err != nil {
		return err
	}
	p.runner = r
	return nil
}

// Run opens the view if start could not, then runs it, until ctx ends.
// It returns nil: nothing the database does stops the service.
func (p *sqlPart) Run(ctx context.Context) error {
	wait := sqlMinBackoff
	for ctx.Err() == nil {
		err := p.open(ctx)
		if err == nil {
			p.mu.Lock()
			r := p.runner
			p.mu.Unlock()
			switch {
			case r == nil:
				err = errors.New("SQL view: no log to follow")
			default:
				// Run ends before ctx only when it cannot read the
				// checkpoint (which watched noted for Ready).
				err = r.Run(ctx)
			}
		}
		if ctx.Err() != nil {
			break
		}
		p.log.Warn().Err(err).Dur("backoff", wait).Msg("SQL view waits for its database")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		wait = min(2*wait, sqlMaxBackoff)
	}
	return nil
}

// note records the outcome of a call to the database: an error is what
// Ready reports until a later call succeeds.
func (p *sqlPart) note(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
}

func (p *sqlPart) state() (*sqlview.View, *projections.Runner, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.view, p.runner, p.err
}

// Lag is how many events of the log the SQL view has yet to apply; an
// error while its database was never reached.
func (p *sqlPart) Lag(ctx context.Context) (uint64, error) {
	_, r, err := p.state()
	if r == nil {
		return 0, fmt.Errorf("SQL view: %v", err)
	}
	return r.Lag(ctx)
}

// Ready reports whether the SQL view keeps up: its runner is not stuck
// retrying one event (or batch) or unable to follow the log, its database
// answers, its last write went through, and it is at most maxViewLag
// events behind.
func (p *sqlPart) Ready(ctx context.Context) error {
	v, r, failed := p.state()
	if r == nil {
		return fmt.Errorf("SQL view: %v", failed)
	}
	lag, err := r.Lag(ctx)
	if err != nil {
		return err
	}
	if err := r.Stuck(); err != nil {
		if failed != nil {
			return fmt.Errorf("SQL view %d events behind, stuck: %v: %v", lag, err, failed)
		}
		return fmt.Errorf("SQL view %d events behind, stuck: %v", lag, err)
	}
	pctx, cancel := context.WithTimeout(ctx, sqlProbeTimeout)
	defer cancel()
	if _, err := v.Checkpoint(pctx); err != nil {
		return fmt.Errorf("SQL view %d events behind, its database does not answer: %v", lag, err)
	}
	if failed != nil {
		return fmt.Errorf("SQL view %d events behind: %v", lag, failed)
	}
	if lag > maxViewLag {
		return fmt.Errorf("SQL view %d events behind", lag)
	}
	return nil
}

// reapPast drops the SQL view's tables of the past made more than ttl
// before now (sqlview.View.ReapPast); nothing while its database was never
// reached.
func (p *sqlPart) reapPast(ctx context.Context, ttl time.Duration, now time.Time) ([]string, error) {
	v, _, _ := p.state()
	if v == nil {
		return nil, nil
	}
	return v.ReapPast(ctx, ttl, now)
}

// reader is the view for reads, UNAVAILABLE while its database was never
// reached.
func (p *sqlPart) reader() (*sqlview.View, error) {
	v, _, err := p.state()
	if v == nil {
		return nil, events.Errorf(events.CodeUnavailable, "SQL view: %v", err)
	}
	return v, nil
}

// Close closes the view's pool; Run must have returned.
func (p *sqlPart) Close() {
	if v, _, _ := p.state(); v != nil {
		v.Close()
	}
}

// watched is the view with each write's outcome noted for Ready.
type watched struct {
	*sqlview.View
	p *sqlPart
}

func (w watched) ApplyBatch(ctx context.Context, envs []events.Envelope) error {
	err := w.View.ApplyBatch(ctx, envs)
	if ctx.Err() == nil {
		w.p.note(err)
	}
	return err
}

func (w watched) Apply(ctx context.Context, env events.Envelope) error {
	return w.ApplyBatch(ctx, []events.Envelope{env})
}

func (w watched) Checkpoint(ctx context.Context) (uint64, error) {
	seq, err := w.View.Checkpoint(ctx)
	if ctx.Err() == nil {
		w.p.note(err)
	}
	return seq, err
}

var (
	_ projections.BatchProjection = watched{}
	_ projections.Checkpointer    = watched{}
)

// sqlViews serves the gateway's reads from the SQL view (--read-from sql):
// Get, List, Counts and the history (gateway.Histories, with the events the
// view has yet to apply from the log). Wait and Watch stay on the KV view,
// whose bucket pushes each change; SQL has no change feed both databases
// share. While the database does not answer, its reads are UNAVAILABLE.
type sqlViews struct {
	kv  viewAdapter
	sql *sqlPart
}

// unavailable is err of a read from the SQL view, UNAVAILABLE unless it
// carries a contract code of its own (NOT_FOUND, INVALID_ARGUMENT).
func unavailable(err error) error {
	if err == nil || events.CodeOf(err) != events.CodeInternal {
		return err
	}
	return events.Errorf(events.CodeUnavailable, "SQL view: %v", err)
}

func (s sqlViews) Get(ctx context.Context, id string) (events.View, error) {
	v, err := s.sql.reader()
	if err != nil {
		return events.View{}, err
	}
	view, err := v.Get(ctx, id)
	return view, unavailable(err)
}

func (s sqlViews) List(ctx context.Context, q gateway.ListQuery) (events.Page, error) {
	v, err := s.sql.reader()
	if err != nil {
		return events.Page{}, err
	}
	page, err := v.List(ctx, sqlview.Query{Phase: q.Phase, Label: q.Label, Name: q.Name, Driver: q.Driver, Node: q.Node,
		Sort: q.Sort, Limit: q.Limit, Cursor: q.Cursor})
	return page, unavailable(err)
}

func (s sqlViews) Counts(ctx context.Context) (map[events.Phase]int, error) {
	v, err := s.sql.reader()
	if err != nil {
		return nil, err
	}
	counts, err := v.Counts(ctx)
	return counts, unavailable(err)
}

func (s sqlViews) History(ctx context.Context, id string, after uint64) ([]events.Envelope, error) {
	v, err := s.sql.reader()
	if err != nil {
		return nil, err
	}
	envs, err := v.History(ctx, id, after)
	return envs, unavailable(err)
}

func (s sqlViews) Wait(ctx context.Context, id string, p events.Phase, after uint64) (events.View, error) {
	return s.kv.Wait(ctx, id, p, after)
}

func (s sqlViews) Settle(ctx context.Context, id string, after uint64) (events.View, error) {
	return s.kv.Settle(ctx, id, after)
}

func (s sqlViews) Watch(ctx context.Context, after uint64) (<-chan events.View, error) {
	return s.kv.Watch(ctx, after)
}

var (
	_ gateway.Views     = sqlViews{}
	_ gateway.Histories = sqlViews{}
)
