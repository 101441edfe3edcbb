// Package projections folds the event log into read models. A Runner follows
// the log from the projection's own checkpoint and feeds every event to the
// Projection, retrying a failed apply with backoff, and tells how far behind
// the log the projection is.
package projections

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
)

// Source delivers the log from a position on; events.Store satisfies it.
type Source interface {
	Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error
}

// Head tells the sequence of the newest event in the log; events.Store
// satisfies it. A Source that is also a Head lets Runner.Lag work.
type Head interface {
	LastSeq(ctx context.Context) (uint64, error)
}

// Projection is one read model. Apply must be idempotent: delivery is at
// least once (a restarted Runner follows the log from the projection's
// checkpoint, or from the start without one), so an event may come again
// after it was applied.
type Projection interface {
	Name() string
	Apply(ctx context.Context, env events.Envelope) error
}

// BatchProjection is a Projection that applies a run of consecutive events
// at once (one write per batch rather than per event). ApplyBatch must be
// idempotent like Apply, and all or nothing as far as the caller can tell:
// on error the whole batch comes again.
type BatchProjection interface {
	ApplyBatch(ctx context.Context, envs []events.Envelope) error
}

// Checkpointer is a Projection that knows the last sequence it holds: a
// Runner follows the log from there, and reports its lag before the first
// new event arrives. A Projection that is not one is fed the whole log on
// every Run.
type Checkpointer interface {
	Checkpoint(ctx context.Context) (uint64, error)
}

// Flusher is a Projection that holds back some writes (a checkpoint, say)
// and writes them when the runner stops.
type Flusher interface {
	Flush(ctx context.Context) error
}

// ErrUnapplicable marks an event a projection can never apply (its sandbox
// id cannot be a key of the view, say): applying it again cannot help. The
// Runner parks such an event (Parker) and goes on with the rest; every
// other error is retried, since a view must not skip an event it could
// apply later (a database that is down).
var ErrUnapplicable = errors.New("the view cannot apply this event")

// Parker is a Projection that records the events it cannot apply: the
// Runner hands it each event whose apply failed with ErrUnapplicable, with
// the error, and goes on. Park must be idempotent: after a restart the
// event may come again. A projection that is no Parker has such events
// logged and counted only.
type Parker interface {
	Park(ctx context.Context, env events.Envelope, why error) error
}

// Config tunes a Runner. The zero value is usable.
type Config struct {
	// Attempts is how often one event (or batch) is applied before the
	// Runner gives up on this reading of the log and follows it again from
	// the last event applied, after a backoff. Default 5.
	Attempts int
	// MinBackoff is the wait after the first failed apply, and before
	// following the log again after a reading that applied something; it
	// doubles on each further failure up to MaxBackoff. Defaults 50ms and
	// 5s.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// BatchSize bounds the events handed over at once (to one ApplyBatch,
	// when the Projection is a BatchProjection). Default 1000.
	BatchSize int
	// Logger receives apply failures; the zero value logs nothing.
	Logger zerolog.Logger
	// Parked counts, besides Runner.Parked, the events parked (metrics);
	// nil counts nothing.
	Parked *metrics.Counter
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Attempts < 0:
		return fmt.Errorf("attempts %d: must not be negative", c.Attempts)
	case c.BatchSize < 0:
		return fmt.Errorf("batch size %d: must not be negative", c.BatchSize)
	case c.MinBackoff < 0 || c.MaxBackoff < 0:
		return errors.New("backoff must not be negative")
	case c.MaxBackoff != 0 && c.MinBackoff > c.MaxBackoff:
		return fmt.Errorf("min backoff %s above max backoff %s", c.MinBackoff, c.MaxBackoff)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Attempts == 0 {
		c.Attempts = 5
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 50 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.MinBackoff > c.MaxBackoff {
		c.MinBackoff = c.MaxBackoff
	}
	return c
}

// Runner applies the log to one Projection.
type Runner struct {
	src  Source
	head Head
	p    Projection
	cfg  Config
	pos  atomic.Uint64
	// parked counts the events this Runner parked (ErrUnapplicable).
	parked atomic.Uint64
	// failing is the sequence of the event (or the first of the batch)
	// whose apply failed last and has not succeeded since; 0 when none.
	failing atomic.Uint64
	// lost is set while following the log fails, until a batch arrives.
	lost atomic.Bool
}

// NewRunner returns a runner of p over src.
func NewRunner(src Source, p Projection, cfg Config) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("projection %s: %w", p.Name(), err)
	}
	r := &Runner{src: src, p: p, cfg: cfg.withDefaults()}
	r.head, _ = src.(Head)
	return r, nil
}

// Run follows the log from the projection's checkpoint and applies events
// until ctx ends; then it returns nil. Events are applied in batches when the
// Projection is a BatchProjection, one at a time otherwise. When an apply
// fails Attempts times, or the log cannot be read, Run follows the log again
// from the last event applied, after a backoff.
func (r *Runner) Run(ctx context.Context) error {
	if cp, ok := r.p.(Checkpointer); ok {
		seq, err := cp.Checkpoint(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("projection %s: checkpoint: %w", r.p.Name(), err)
		}
		r.advance(seq)
	}
	bp, batched := r.p.(BatchProjection)
	h := func(ctx context.Context, envs []events.Envelope, _ uint64) error {
		r.lost.Store(false)
		if batched {
			return r.applyBatch(ctx, bp, envs)
		}
		for _, env := range envs {
			if err := r.apply(ctx, env); err != nil {
				return err
			}
		}
		return nil
	}
	// The wait before following again starts at MinBackoff and doubles,
	// up to MaxBackoff, while readings apply nothing: a reading ended by a
	// NATS server's loss (its consumer's beats missed) follows again at
	// once, where a fixed MaxBackoff kept the view 5 s further behind
	// after every fault.
	backoff := r.cfg.MinBackoff
	for ctx.Err() == nil {
		from := r.Position()
		err := r.src.Follow(ctx, from, r.cfg.BatchSize, h)
		if ctx.Err() != nil {
			break
		}
		if r.Position() == from {
			r.lost.Store(true) // nothing applied in this reading
		} else {
			backoff = r.cfg.MinBackoff
		}
		r.cfg.Logger.Warn().Err(err).Str("projection", r.p.Name()).Uint64("seq", from).
			Dur("backoff", backoff).Msg("following the log again")
		t := time.NewTimer(backoff)
		backoff = min(2*backoff, r.cfg.MaxBackoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if f, ok := r.p.(Flusher); ok {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := f.Flush(fctx); err != nil {
			return fmt.Errorf("projection %s: flush: %w", r.p.Name(), err)
		}
	}
	return nil
}

// apply is Apply with bounded retries; the last error ends the reading of
// the log, which Run starts again from the last event applied.
func (r *Runner) apply(ctx context.Context, env events.Envelope) error {
	wait := r.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		err := r.p.Apply(ctx, env)
		if errors.Is(err, ErrUnapplicable) {
			err = r.park(ctx, env, err)
		}
		if err == nil {
			r.failing.Store(0)
			r.advance(env.Seq)
			return nil
		}
		r.failing.Store(env.Seq)
		log := r.cfg.Logger.With().Str("projection", r.p.Name()).Str("sandbox_id", env.SandboxID).
			Str("event_type", env.Type).Uint64("seq", env.Seq).Int("attempt", attempt).Logger()
		if attempt >= r.cfg.Attempts || ctx.Err() != nil {
			log.Error().Err(err).Msg("apply failed; following the log again")
			return fmt.Errorf("apply %s seq %d: %w", env.Type, env.Seq, err)
		}
		log.Warn().Err(err).Dur("backoff", wait).Msg("apply failed; retrying")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("apply %s seq %d: %w", env.Type, env.Seq, err)
		case <-t.C:
		}
		wait = min(2*wait, r.cfg.MaxBackoff)
	}
}

// applyBatch is ApplyBatch with the same bounded retries as apply.
func (r *Runner) applyBatch(ctx context.Context, p BatchProjection, envs []events.Envelope) error {
	if len(envs) == 0 {
		return nil
	}
	first, last := envs[0], envs[len(envs)-1]
	wait := r.cfg.MinBackoff
	for attempt := 1; ; attempt++ {
		err := p.ApplyBatch(ctx, envs)
		if err == nil {
			r.failing.Store(0)
			r.advance(last.Seq)
			return nil
		}
		if errors.Is(err, ErrUnapplicable) {
			// One event of the batch cannot be applied: the batch goes one
			// event at a time, so that the others are and that one is
			// parked.
			for _, env := range envs {
				if err := r.apply(ctx, env); err != nil {
					return err
				}
			}
			return nil
		}
		r.failing.Store(first.Seq)
		log := r.cfg.Logger.With().Str("projection", r.p.Name()).Uint64("seq", first.Seq).
			Uint64("last_seq", last.Seq).Int("events", len(envs)).Int("attempt", attempt).Logger()
		if attempt >= r.cfg.Attempts || ctx.Err() != nil {
			log.Error().Err(err).Msg("apply failed; following the log again")
			return fmt.Errorf("apply seq %d to %d: %w", first.Seq, last.Seq, err)
		}
		log.Warn().Err(err).Dur("backoff", wait).Msg("apply failed; retrying")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("apply seq %d to %d: %w", first.Seq, last.Seq, err)
		case <-t.C:
		}
		wait = min(2*wait, r.cfg.MaxBackoff)
	}
}

// park records env, which the projection cannot apply (why), through its
// Parker, and counts it; an error of the Parker is retried as an apply's.
func (r *Runner) park(ctx context.Context, env events.Envelope, why error) error {
	if pk, ok := r.p.(Parker); ok {
		if err := pk.Park(ctx, env, why); err != nil {
			return fmt.Errorf("park: %w (parking %w)", err, why)
		}
	}
	r.parked.Add(1)
	r.cfg.Parked.Inc()
	r.cfg.Logger.Error().Err(why).Str("projection", r.p.Name()).Str("sandbox_id", env.SandboxID).
		Str("event_type", env.Type).Uint64("seq", env.Seq).Msg("event parked: the view cannot apply it; going on with the rest")
	return nil
}

// Parked is how many events this Runner parked: events its projection can
// never apply (ErrUnapplicable), recorded by the projection if it is a
// Parker, and skipped.
func (r *Runner) Parked() uint64 { return r.parked.Load() }

// advance moves the position forward to seq, never back.
func (r *Runner) advance(seq uint64) {
	for {
		cur := r.pos.Load()
		if seq <= cur {
			return
		}
		if r.pos.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// Position is the highest sequence applied (or held at start, for a
// Checkpointer); 0 before any.
func (r *Runner) Position() uint64 { return r.pos.Load() }

// Stuck says why the projection is stuck, or nil: an apply that fails
// and is being retried (the same event, or batch, again), or a log it
// cannot follow. A stuck view answers reads that fall ever further behind
// the log: /readyz fails while it is (CONTRACT §5). A view that lags
// without failing is for Lag to judge: messages at the log's end that are
// not events (foreign) are never delivered and leave a lag that is no
// stop.
func (r *Runner) Stuck() error {
	if seq := r.failing.Load(); seq != 0 {
		return fmt.Errorf("projection %s: the apply of seq %d fails and is being retried", r.p.Name(), seq)
	}
	if r.lost.Load() {
		return fmt.Errorf("projection %s: the log cannot be followed", r.p.Name())
	}
	return nil
}

// Lag is how many sequences the log is ahead of Position. It needs a Source
// that is also a Head.
func (r *Runner) Lag(ctx context.Context) (uint64, error) {
	if r.head == nil {
		return 0, fmt.Errorf("projection %s: lag: source has no last sequence", r.p.Name())
	}
	last, err := r.head.LastSeq(ctx)
	if err != nil {
		return 0, fmt.Errorf("projection %s: lag: %w", r.p.Name(), err)
	}
	if pos := r.Position(); last > pos {
		return last - pos, nil
	}
	return 0, nil
}
