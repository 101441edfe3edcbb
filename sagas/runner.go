package sagas

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Source delivers the log (events.Store satisfies it).
type Source interface {
	Subscribe(ctx context.Context, name string, h events.Handler) error
	Load(ctx context.Context, id string, after uint64) ([]events.Envelope, error)
}

// Recorder appends outcome events through the lifecycle state machine (the
// gateway implements it). It appends evs for cause.SandboxID atomically with
// metadata cause.Caused(actor), validated by the lifecycle table and
// generation fencing; it returns an *events.Error with CodeFailedPrecondition
// when the sandbox's phase or generation no longer accepts them.
type Recorder interface {
	Record(ctx context.Context, cause events.Envelope, actor string, evs ...events.Event) error
}

// Drivers resolves a driver by name (compute.Registry satisfies it).
type Drivers interface {
	Driver(name string) (compute.Driver, error)
}

var _ Drivers = compute.Registry(nil)

// The durable subscription names (see the package comment).
const (
	FloorName = "sagas"
	AheadName = "sagas-ahead"
)

// aheadFactor × Workers is how many intents the look-ahead subscription may
// dispatch beyond the ack floor.
const aheadFactor = 4

// intents are the event types that ask for a driver step.
var intents = map[string]bool{
	events.Created{}.Type():          true,
	events.StartRequested{}.Type():   true,
	events.StopRequested{}.Type():    true,
	events.SuspendRequested{}.Type(): true,
	events.ResumeRequested{}.Type():  true,
	events.DeleteRequested{}.Type():  true,
}

// Runner runs the sagas of one node. Run it once.
type Runner struct {
	src   Source
	rec   Recorder
	drv   Drivers
	creds *compute.Credentials
	cfg   Config
	log   zerolog.Logger

	sem     chan struct{} // a token per running step
	ahead   chan struct{} // a token per job the look-ahead dispatched and the floor has not passed
	workers sync.WaitGroup
	started atomic.Bool
	specs   *specCache

	mu     sync.Mutex
	jobs   map[uint64]*job   // dispatched intents by sequence, until the floor passes them
	queues map[string][]*job // per sandbox, jobs waiting for its worker
	floor  uint64            // the highest sequence the floor subscription passed
}

// job is one intent on its way through a step.
type job struct {
	env   events.Envelope
	ahead bool // dispatched by the look-ahead; holds an ahead token
	done  chan struct{}
	err   error // set before done is closed
}

// New returns a Runner over the log src that records through rec and drives
// the drivers of drv, minting supervisor credentials with creds.
func New(src Source, rec Recorder, drv Drivers, creds *compute.Credentials, cfg Config, log zerolog.Logger) (*Runner, error) {
	if src == nil || rec == nil || drv == nil || creds == nil {
		return nil, errors.New("sagas: source, recorder, drivers and credentials are required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Runner{
		src:    src,
		rec:    rec,
		drv:    drv,
		creds:  creds,
		cfg:    cfg,
		log:    log,
		sem:    make(chan struct{}, cfg.Workers),
		ahead:  make(chan struct{}, aheadFactor*cfg.Workers),
		specs:  newSpecCache(specCacheSize),
		jobs:   map[uint64]*job{},
		queues: map[string][]*job{},
	}, nil
}

// Run subscribes to the log and drives sagas until ctx ends or a
// subscription fails. It returns after every goroutine it started has
// finished; nil when ctx ended.
func (r *Runner) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("sagas: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	subs := []struct {
		name string
		h    events.Handler
	}{
		{FloorName, func(hctx context.Context, env events.Envelope) error { return r.onFloor(ctx, hctx, env) }},
		{AheadName, func(hctx context.Context, env events.Envelope) error { return r.onAhead(ctx, hctx, env) }},
	}
	errc := make(chan error, len(subs))
	var wg sync.WaitGroup
	for _, s := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel() // one subscription ending ends the other
			if err := r.src.Subscribe(ctx, s.name, s.h); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("subscribe %s: %w", s.name, err)
			}
		}()
	}
	r.log.Info().Str("node", r.cfg.Node).Int("workers", r.cfg.Workers).Dur("deadline", r.cfg.Deadline).Msg("sagas running")
	wg.Wait()
	// Jobs are dispatched only from the handlers, which have returned.
	r.workers.Wait()
	r.log.Info().Msg("sagas stopped")
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// onFloor handles an event on the ack floor: it returns only when an intent's
// step has finished, dispatching the intent itself if the look-ahead has not.
func (r *Runner) onFloor(runCtx, ctx context.Context, env events.Envelope) error {
	if !intents[env.Type] {
		r.pass(env.Seq, nil)
		return nil
	}
	r.mu.Lock()
	j := r.jobs[env.Seq]
	if j == nil {
		j = r.dispatchLocked(runCtx, env, false)
	}
	r.mu.Unlock()
	select {
	case <-j.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.pass(env.Seq, j)
	return j.err
}

// pass records that the floor passed seq, finishing with j (nil for a
// non-intent). A failed step does not move the floor: it comes again.
func (r *Runner) pass(seq uint64, j *job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j != nil {
		if r.jobs[seq] == j {
			delete(r.jobs, seq)
			if j.ahead {
				<-r.ahead
			}
		}
		if j.err != nil {
			return
		}
	}
	if seq > r.floor {
		r.floor = seq
	}
}

// onAhead dispatches an intent and acknowledges it at once, unless the floor
// already passed it or it is already dispatched. It waits while the
// look-ahead is full.
func (r *Runner) onAhead(runCtx, ctx context.Context, env events.Envelope) error {
	if !intents[env.Type] {
		return nil
	}
	select {
	case r.ahead <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if env.Seq <= r.floor || r.jobs[env.Seq] != nil {
		<-r.ahead
		return nil
	}
	r.dispatchLocked(runCtx, env, true)
	return nil
}

// dispatchLocked queues env on its sandbox's queue, starting the sandbox's
// worker if it has none. r.mu is held.
func (r *Runner) dispatchLocked(ctx context.Context, env events.Envelope, ahead bool) *job {
	j := &job{env: env, ahead: ahead, done: make(chan struct{})}
	r.jobs[env.Seq] = j
	q, busy := r.queues[env.SandboxID]
	r.queues[env.SandboxID] = append(q, j)
	if !busy {
		r.workers.Add(1)
		go r.work(ctx, env.SandboxID)
	}
	return j
}

// work runs the queued jobs of one sandbox in order and ends when its queue
// is empty.
func (r *Runner) work(ctx context.Context, id string) {
	defer r.workers.Done()
	for {
		r.mu.Lock()
		q := r.queues[id]
		if len(q) == 0 {
			delete(r.queues, id)
			r.mu.Unlock()
			return
		}
		j := q[0]
		r.queues[id] = q[1:]
		r.mu.Unlock()

		select {
		case r.sem <- struct{}{}:
			j.err = r.step(ctx, j.env)
			<-r.sem
		case <-ctx.Done():
			j.err = ctx.Err()
		}
		close(j.done)
	}
}
