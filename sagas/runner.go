package sagas

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/warm"
	"github.com/torpor/torpor/services/compute"
)

// Source is the log as the Runner reads it (events.Store satisfies it).
type Source interface {
	Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error
	Load(ctx context.Context, id string, after uint64) ([]events.Envelope, error)
}

// Position keeps the Runner's place in the log between runs (jsstore's
// Position keeps it in a KV bucket). The Runner sets it only to a sequence
// at or below which every intent has finished its step, so a new Run that
// follows the log from there re-drives whatever was left unfinished.
type Position interface {
	Get(ctx context.Context) (uint64, error)
	Set(ctx context.Context, seq uint64) error
}

// PositionKey names node's Runner position among the followers' positions
// (jsstore.PositionBucket): each node's sagas keep their own place.
func PositionKey(node string) string { return "sagas." + node }

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

const (
	// followBatch bounds the events the Runner takes from the log at once.
	followBatch = 256
	// queuedFactor × Workers bounds the unfinished intents; the Runner reads
	// no further in the log while that many are queued or running.
	queuedFactor = 16
	// A step that fails comes again after retryMin, doubling up to retryMax.
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// Runner runs the sagas of one node. Run it once.
type Runner struct {
	src   Source
	pos   Position
	rec   Recorder
	drv   Drivers
	creds *compute.Credentials
	cfg   Config
	log   zerolog.Logger

	sem chan struct{} // a token per running step
	// lane is the passed deadlines' own tokens: a settle never waits for a
	// slot held by a slow step of another sandbox (issue 24, hole 10).
	lane    chan struct{}
	workers sync.WaitGroup
	warm    *warm.Pool // runs the workers on goroutines with grown stacks
	// late runs the suspend calls a deadline cut short, and waits for
	// their answers (suspend.go).
	late    sync.WaitGroup
	started atomic.Bool
	specs   *specCache

	mu        sync.Mutex
	jobs      map[uint64]*job          // unfinished intents by sequence
	queues    map[string][]*job        // per sandbox, jobs waiting for its worker; a key exists while the worker runs
	freed     chan struct{}            // closed and replaced when a job finishes
	processed uint64                   // the last sequence handed to dispatch
	caughtUp  uint64                   // the last sequence of the newest batch that reached the head of the log
	waking    map[string]chan struct{} // per sandbox whose worker waits for a slot, closed by a deadline queued (due)
	phases    map[string]events.Phase  // per sandbox read, its phase as the lifecycle table folds it
	refused   atomic.Uint64            // events passed over: the table refuses them (Refused)
	stopping  bool                     // Run is ending: no deadline starts a job
	began     time.Time                // when Run started (the attach grace after a restart)
	// live is caughtUp when the runner first read the log to its head: an
	// intent after it was appended while this runner ran, and no runner
	// before it drove it (one runner per node).
	live uint64
	// reached is, per sandbox, what this runner knows of the resume on
	// another node it is driving (reach, resume.go); dropped when the
	// sandbox leaves the transient phase.
	reached map[string]*reach
	// refusals are the targets' refusals of resumes not yet recorded, by
	// intent id (check.go).
	refusals map[string]*refusal
	// timers are the armed timers, per sandbox and kind (timer.go): the
	// deadline of the transient phase a sandbox is in, its ttl, its
	// retention, its idle policy.
	timers map[timerKey]*timer
	// kept are the long timers' keys Config.Timers holds, as far as this
	// runner knows (keep).
	kept map[timerKey]bool
}

// warmKeep is how long a worker's goroutine waits for the next sandbox
// before it ends.
const warmKeep = time.Second

// job is one intent on its way through a step, or a passed deadline on its
// way to being settled.
type job struct {
	env events.Envelope
	// intent is env decoded when dispatch decoded it (a sandbox.created),
	// else nil: the step decodes env.
	intent events.Event
	// later holds the sandbox's events that came after the intent while the
	// job waited in its queue.
	later []events.Envelope
	// reload says the job left its queue for a while (it gave way to a
	// deadline): later misses what came meanwhile, and is loaded.
	reload bool
	// timer, when set, makes this the job of that timer come due (a
	// passed deadline, a ttl, a retention, an idle policy).
	timer *timer
	// late, when set, makes this the job of a suspend's answer that came
	// after its deadline (env is the suspend's intent).
	late *lateSuspend
}

// settles says whether j is the job of a passed deadline.
func (j *job) settles() bool { return j.timer != nil && j.timer.key.kind == kindDeadline }

// New returns a Runner over the log src, keeping its place in pos, that
// records through rec and drives the drivers of drv, minting supervisor
// credentials with creds.
func New(src Source, pos Position, rec Recorder, drv Drivers, creds *compute.Credentials, cfg Config, log zerolog.Logger) (*Runner, error) {
	if src == nil || pos == nil || rec == nil || drv == nil || creds == nil {
		return nil, errors.New("sagas: source, position, recorder, drivers and credentials are required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Fence != nil {
		rec, pos = fencedRecorder{rec, cfg.Fence}, fencedPosition{pos, cfg.Fence}
		if cfg.Timers != nil {
			cfg.Timers = fencedTimers{cfg.Timers, cfg.Fence}
		}
	}
	return &Runner{
		src:    src,
		pos:    pos,
		rec:    rec,
		drv:    drv,
		creds:  creds,
		cfg:    cfg,
		log:    log,
		sem:    make(chan struct{}, cfg.Workers),
		lane:   make(chan struct{}, cfg.Workers),
		warm:   warm.New(warmKeep),
		specs:  newSpecCache(specCacheSize),
		jobs:   map[uint64]*job{},
		queues: map[string][]*job{},
		timers: map[timerKey]*timer{},
		kept:   map[timerKey]bool{},
		waking: map[string]chan struct{}{},
		phases: map[string]events.Phase{},
		freed:  make(chan struct{}),

		reached: map[string]*reach{},

		refusals: map[string]*refusal{},
	}, nil
}

// Run follows the log from the saved position and drives sagas until ctx
// ends; it then waits for every step it started, saves its position and
// returns nil. An error means the position could not be read.
func (r *Runner) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("sagas: Run called twice")
	}
	from, err := r.pos.Get(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("sagas: position: %w", err)
	}
	if err := r.rebuild(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("sagas: timers: %w", err)
	}
	r.mu.Lock()
	r.processed, r.began = from, time.Now()
	r.mu.Unlock()
	r.log.Info().Str("node", r.cfg.Node).Int("workers", r.cfg.Workers).Dur("deadline", r.cfg.Deadline).
		Uint64("seq", from).Msg("sagas running")

	var saver sync.WaitGroup
	saved := from
	saver.Go(func() { saved = r.saveEvery(ctx, saved) })

	wait := retryMin
	for ctx.Err() == nil {
		r.mu.Lock()
		after := r.processed
		r.mu.Unlock()
		err := r.src.Follow(ctx, after, followBatch, func(_ context.Context, envs []events.Envelope, pending uint64) error {
			return r.dispatch(ctx, envs, pending)
		})
		if ctx.Err() != nil {
			break
		}
		r.mu.Lock()
		moved := r.processed > after
		r.mu.Unlock()
		if moved { // it had been following: start the backoff afresh
			wait = retryMin
		}
		r.log.Warn().Err(err).Uint64("seq", after).Dur("backoff", wait).Msg("following the log failed; following again")
		if !sleep(ctx, wait) {
			break
		}
		wait = min(2*wait, retryMax)
	}
	// Jobs are started by dispatch, which has returned, and by deadlines,
	// which start none from now on.
	r.mu.Lock()
	r.stopping = true
	r.stopTimers()
	r.mu.Unlock()
	r.workers.Wait()
	r.late.Wait()  // late answers queue no job once stopping
	r.warm.Close() // no goroutine of the pool outlives Run
	saver.Wait()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	r.keep(sctx)
	if f := r.floor(); f > saved {
		if err := r.pos.Set(sctx, f); err != nil {
			r.log.Warn().Err(err).Uint64("seq", f).Msg("save position; the next run re-reads from an older one")
		}
	}
	r.log.Info().Msg("sagas stopped")
	return nil
}

// saveEvery saves the floor every Config.CheckpointEvery while it moves,
// until ctx ends; it returns the last position saved.
func (r *Runner) saveEvery(ctx context.Context, saved uint64) uint64 {
	t := time.NewTicker(r.cfg.CheckpointEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return saved
		case <-t.C:
		}
		r.keep(ctx)
		f := r.floor()
		if f <= saved {
			continue
		}
		if err := r.pos.Set(ctx, f); err != nil {
			if ctx.Err() == nil {
				r.log.Warn().Err(err).Uint64("seq", f).Msg("save position")
			}
			continue
		}
		saved = f
	}
}

// floor is the highest sequence at or below which every intent has
// finished, every transient phase entered has ended, and every long timer
// armed is kept in Config.Timers: a runner that starts from it reads again
// each intent left unfinished, each phase whose deadline is still to come
// and each event that armed a long timer the record lacks.
func (r *Runner) floor() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.floorLocked(true)
}

// floorLocked is floor, counting the long timers not kept when long is
// set; r.mu is held.
func (r *Runner) floorLocked(long bool) uint64 {
	f := r.processed
	for seq := range r.jobs {
		f = min(f, seq-1)
	}
	for k, x := range r.timers {
		if x.env.Seq == 0 || (k.long() && (!long || r.kept[k])) {
			continue // rebuilt from the record (kept), or kept
		}
		f = min(f, x.env.Seq-1)
	}
	return f
}

// dispatch hands a batch of the log to the sandboxes' queues. Intents become
// jobs; every event also goes to the jobs still waiting in its sandbox's
// queue, so that a job that starts after the Runner caught up with the log
// knows what followed its intent without loading it. Workers for new queues
// start once the whole batch is in place. It waits while too many jobs are
// unfinished.
func (r *Runner) dispatch(ctx context.Context, envs []events.Envelope, pending uint64) error {
	if err := r.room(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	var start []string
	for _, env := range envs {
		if env.Seq <= r.processed {
			continue // a follow that started again hands out what was dispatched
		}
		var ok bool
		if env, ok = r.phase(env); !ok {
			r.processed = env.Seq
			continue // refused by the table: no step, no deadline
		}
		for _, j := range r.queues[env.SandboxID] {
			j.later = append(j.later, env)
		}
		// A sandbox.created is decoded once, here: track reads its node,
		// its job takes it to the step.
		created := r.createdOf(env)
		r.moved(env)
		if drivesStep(env.Type) {
			j := &job{env: env}
			if created != nil {
				j.intent = created
			}
			r.jobs[env.Seq] = j
			if r.enqueue(j) {
				start = append(start, env.SandboxID)
			}
		}
		// After the intent's job: a deadline already passed queues behind it.
		r.track(ctx, env, created)
		r.trackExpiry(ctx, env, created)
		r.trackIdle(ctx, env, created)
		r.processed = env.Seq
	}
	if pending == 0 && len(envs) > 0 {
		r.caughtUp = max(r.caughtUp, envs[len(envs)-1].Seq)
		if r.live == 0 {
			r.live = r.caughtUp
		}
	}
	r.mu.Unlock()
	for _, id := range start {
		r.warm.Go(func() { r.work(ctx, id) })
	}
	return nil
}

// phase folds env's sandbox's phase through the lifecycle table, as the
// aggregate does, and returns env stamped with the phase it moves to; r.mu
// is held. An event the table refuses (forged on the bus, or a writer's
// bug: the aggregate passed over it too), or whose data does not decode,
// is counted and reported not ok: it drives no step and arms or disarms no
// deadline. The phase of a sandbox first read after a restart is not
// known; its first event is then taken at its stamp if the table can
// produce that phase with that event from some phase, else refused.
func (r *Runner) phase(env events.Envelope) (events.Envelope, bool) {
	id := env.SandboxID
	from, known := r.phases[id]
	var to events.Phase
	var err error
	if _, err = env.Decode(); err == nil {
		if known {
			to, err = events.Next(from, env.Type)
		} else {
			to, err = seed(env)
		}
	}
	if err != nil {
		r.refused.Add(1)
		r.log.Warn().Err(err).Str("sandbox_id", id).Str("event_type", env.Type).Uint64("seq", env.Seq).
			Msg("event passed over: the lifecycle table refuses it")
		return env, false
	}
	r.phases[id] = to
	env.Phase = to
	return env, true
}

// seed is the phase after env for a sandbox whose phase before it is not
// known: its stamp, if the table moves some phase there on env's type.
func seed(env events.Envelope) (events.Phase, error) {
	for _, from := range append([]events.Phase{events.PhaseNone}, events.Phases...) {
		if to, err := events.Next(from, env.Type); err == nil && to == env.Phase {
			return to, nil
		}
	}
	return "", fmt.Errorf("%w: %s cannot leave a sandbox %q", events.ErrRefused, env.Type, env.Phase)
}

// Refused is how many events the runner passed over because the lifecycle
// table refuses them (or their data does not decode).
func (r *Runner) Refused() uint64 { return r.refused.Load() }

// enqueue puts j at the end of its sandbox's queue; r.mu is held. When the
// queue had no worker it counts one in r.workers and returns true: the
// caller then starts it, r.work on j's sandbox.
func (r *Runner) enqueue(j *job) (start bool) {
	id := j.env.SandboxID
	q, busy := r.queues[id]
	r.queues[id] = append(q, j)
	if !busy {
		r.workers.Add(1)
	}
	return !busy
}

// room waits until fewer than queuedFactor × Workers jobs are unfinished.
func (r *Runner) room(ctx context.Context) error {
	for {
		r.mu.Lock()
		full, freed := len(r.jobs) >= queuedFactor*r.cfg.Workers, r.freed
		r.mu.Unlock()
		if !full {
			return nil
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// work runs the queued jobs of one sandbox in order and ends when its queue
// is empty. A job whose step fails runs again after a backoff, holding up
// only its sandbox; a job left unfinished when ctx ends stays below the
// floor, for the next Run.
func (r *Runner) work(ctx context.Context, id string) {
	defer r.workers.Done()
next:
	for {
		r.mu.Lock()
		q := r.queues[id]
		if len(q) == 0 {
			delete(r.queues, id)
			r.mu.Unlock()
			return
		}
		// A passed deadline goes before the steps that have not started:
		// they wait for a worker slot, it has a lane of its own, and the
		// step of a phase it settles finds its intent settled.
		j := q[0]
		if i := slices.IndexFunc(q, (*job).settles); i > 0 {
			j, q = q[i], append(q[:i:i], q[i+1:]...)
		} else {
			q = q[1:]
		}
		r.queues[id] = q
		// Every event up to caughtUp went to the job while it waited in
		// the queue (and it did not leave it meanwhile).
		seen := r.caughtUp >= j.env.Seq && !j.reload
		r.mu.Unlock()

		later := j.later
		// A passed deadline takes its token from its own lane: the steps of
		// other sandboxes may hold every worker slot for as long as their
		// driver calls last, and a deadline must not wait for them.
		sem := r.sem
		if j.timer != nil {
			sem = r.lane
		}
		for wait := retryMin; ; wait = min(2*wait, retryMax) {
			switch r.acquire(ctx, sem, j) {
			case gaveWay:
				continue next
			case stopped:
				return
			}
			var err error
			switch err = r.fenced(); {
			case err != nil: // not ours to drive any more: the runner is ending
			case j.timer != nil:
				err = r.fire(ctx, j.timer)
			case j.late != nil:
				err = r.takeLate(ctx, j)
			default:
				err = r.step(ctx, j, later, seen)
			}
			<-sem
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			r.log.Warn().Err(err).Str("sandbox_id", id).Uint64("seq", j.env.Seq).Dur("backoff", wait).Msg("step failed; it comes again")
			if !sleep(ctx, wait) {
				return
			}
			seen, later = false, nil // the log moved meanwhile: load it again
		}
		if j.timer != nil || j.late != nil {
			continue // a timer holds the floor while armed, not as a job; a late answer holds none
		}
		r.mu.Lock()
		delete(r.jobs, j.env.Seq)
		close(r.freed)
		r.freed = make(chan struct{})
		r.mu.Unlock()
	}
}

// fenced is Config.Fence's answer, nil without one.
func (r *Runner) fenced() error {
	if r.cfg.Fence == nil {
		return nil
	}
	return r.cfg.Fence()
}

// How acquire ended.
const (
	acquired = iota // j holds a token of sem
	gaveWay         // j went back to its queue, behind a deadline of its sandbox
	stopped         // ctx ended
)

// acquire takes a token of sem for j. A step that has to wait for one
// gives way to a deadline of its sandbox that passes meanwhile: it goes
// back to the head of its queue, behind the deadline.
func (r *Runner) acquire(ctx context.Context, sem chan struct{}, j *job) int {
	select {
	case sem <- struct{}{}:
		return acquired
	default:
	}
	id := j.env.SandboxID
	var wake chan struct{} // nil for a timer: it waits for its lane only
	if j.timer == nil {
		wake = r.wakeOn(id)
	}
	select {
	case sem <- struct{}{}:
		r.unwake(id, wake)
		return acquired
	case <-wake:
		r.requeue(j)
		return gaveWay
	case <-ctx.Done():
		r.unwake(id, wake)
		return stopped
	}
}

// wakeOn returns a channel that a deadline of sandbox id queued from now
// on closes (due), for the worker of id waiting for a slot.
func (r *Runner) wakeOn(id string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := make(chan struct{})
	r.waking[id] = w
	return w
}

// unwake forgets w, if a deadline did not close it.
func (r *Runner) unwake(id string, w chan struct{}) {
	if w == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waking[id] == w {
		delete(r.waking, id)
	}
}

// requeue puts j back at the head of its sandbox's queue, to be taken again
// after the deadline that woke its worker; what followed its intent is
// loaded then (it missed what came while it was out of the queue).
func (r *Runner) requeue(j *job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := j.env.SandboxID
	j.later, j.reload = nil, true
	r.queues[id] = append([]*job{j}, r.queues[id]...)
}

// sleep waits d; false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
