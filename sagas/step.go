package sagas

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/services/compute"
)

// actor is the actor of every event the sagas record.
const actor = "sagas"

// Record retries: attempts and backoff bounds.
const (
	recordAttempts = 8
	backoffMin     = 20 * time.Millisecond
	backoffMax     = 2 * time.Second
)

var (
	// errRefused: the Recorder refused the outcome (FAILED_PRECONDITION): the
	// sandbox moved on, the step compensates and is dropped.
	errRefused = errors.New("outcome refused")
	// errDeadline: the phase's deadline ended the driver call; the phase's
	// deadline settles it (deadline.go).
	errDeadline = errors.New("deadline passed")
	// errStopping: the runner is stopping; the step is left to be re-driven.
	errStopping = errors.New("runner stopping")
)

// step is one intent being driven.
type step struct {
	// saga names the saga in the metrics: sagaOf the intent, or deadline.
	saga    string
	intent  events.Envelope
	created *events.Created
	spec    compute.Spec
	driver  compute.Driver
	drvErr  error // why driver is nil
	// envErr is why the env seal of created does not open here
	// (compute.ErrEnvSealed: sealed under a key this service no longer
	// holds, or tampered with); spec then holds the redacted values.
	envErr error
	// suspender is driver as a compute.Suspender, nil when it is none.
	suspender compute.Suspender
	later     []events.Envelope // the sandbox's events after the intent
	log       zerolog.Logger
	// slot is the worker slot the step holds, given back while it backs
	// off (pause); nil when it holds none of the runner's.
	slot chan struct{}
}

// drivesStep says whether an event of type typ is one the runner drives a
// step for: an intent of a command, the clean-up a deadline asked for, or
// an expiry (its release of an invalidated retained state, expiry.go).
func drivesStep(typ string) bool {
	return events.Intent(typ) || typ == events.TypeCleanupRequested || typ == events.TypeExpired
}

// sagaOf names the saga an intent type starts, "" for any other type: the
// verb of sandbox.<verb>_requested, create for sandbox.created, and cleanup
// for sandbox.cleanup_requested.
func sagaOf(typ string) string {
	switch {
	case typ == events.TypeCleanupRequested:
		return "cleanup"
	case typ == events.TypeExpired:
		return "expiry"
	case !events.Intent(typ):
		return ""
	case typ == events.TypeCreated:
		return "create"
	}
	return strings.TrimSuffix(strings.TrimPrefix(typ, "sandbox."), "_requested")
}

// step drives j's intent: it checks the intent is ours and still open, then
// runs its saga. later holds the sandbox's events after the intent when seen
// says they are all there is; otherwise step loads them. A nil error means
// the intent is finished with (recorded, skipped or compensated); an error
// means it must come again.
func (r *Runner) step(ctx context.Context, j *job, later []events.Envelope, seen bool) error {
	env := j.env
	log := r.log.With().
		Str("sandbox_id", env.SandboxID).
		Str("event_type", env.Type).
		Uint64("seq", env.Seq).
		Str("saga", sagaOf(env.Type)).
		Logger()
	intent := j.intent
	if intent == nil {
		var err error
		if intent, err = env.Decode(); err != nil {
			log.Error().Err(err).Msg("undecodable intent dropped")
			return nil
		}
	}
	created, err := r.created(ctx, env, intent)
	if err != nil {
		log.Warn().Err(err).Msg("load sandbox")
		return err
	}
	if created == nil {
		log.Error().Msg("sandbox has no sandbox.created; intent dropped")
		return nil
	}
	if !r.drives(created.Node) {
		return nil
	}
	if !seen {
		if later, err = r.src.Load(ctx, env.SandboxID, env.Seq); err != nil {
			log.Warn().Err(err).Msg("load later events")
			return fmt.Errorf("load %s after %d: %w", env.SandboxID, env.Seq, err)
		}
	}
	if why := settled(env, later); why != "" && env.Type != events.TypeExpired {
		log.Debug().Str("step", "skip").Msg(why)
		return nil
	}
	s := &step{
		saga:    sagaOf(env.Type),
		intent:  env,
		created: created,
		spec:    compute.SpecOf(env.SandboxID, created), // env opened below
		later:   later,
		log:     log,
		slot:    r.sem,
	}
	s.driver, s.drvErr = r.drv.Driver(created.Driver)
	if spec, err := r.creds.SpecOf(env.SandboxID, created); err == nil {
		s.spec = spec
	} else {
		s.envErr = err
		if s.drvErr == nil && starts(intent) {
			// Sealed under another key, or tampered with: no start with
			// the values redacted; the start fails saying why.
			s.driver, s.drvErr = nil, err
		}
	}
	s.suspender, _ = s.driver.(compute.Suspender)
	if s.drvErr != nil && !starts(intent) {
		log.Error().Err(s.drvErr).Msg("no driver; intent dropped")
		return nil
	}
	switch e := intent.(type) {
	case *events.Created:
		return r.start(ctx, s, e.Generation)
	case *events.StartRequested:
		return r.start(ctx, s, e.Generation)
	case *events.StopRequested:
		return r.stop(ctx, s, e)
	case *events.SuspendRequested:
		return r.suspend(ctx, s, e)
	case *events.ResumeRequested:
		return r.resume(ctx, s, e)
	case *events.DeleteRequested:
		return r.delete(ctx, s)
	case *events.CleanupRequested:
		return r.cleanup(ctx, s, e)
	case *events.Expired:
		return r.release(ctx, s)
	}
	return nil
}

// settled says why the intent needs no step, or "" if it does: an event it
// caused is in the log (its outcome is recorded, by the saga or by its
// deadline: the sagas are the one writer of a driver's answer) or a later
// intent supersedes it.
func settled(intent events.Envelope, later []events.Envelope) string {
	for _, e := range later {
		switch {
		case e.CausationID == intent.ID && !progress[e.Type]:
			return "outcome already recorded"
		case events.Intent(e.Type):
			return "superseded by " + e.Type
		}
	}
	return ""
}

// progress are the events a saga records on its way, before its outcome:
// the resume saga records the consumption of the retained state on its own,
// at the point of no return, and its outcome after it. An intent with only
// progress recorded is not settled: a re-driven resume (idempotent in the
// driver) goes on to record the outcome.
var progress = map[string]bool{
	events.TypeRetainedStateConsumed: true,
}

// within runs call under the phase deadline of s's intent (the intent's
// time plus Config.Deadline: a step re-driven after a restart does not get
// a fresh one). A call that fails without an answer (retry says so of its
// error: the driver unreachable, say) is made again, after a backoff, until
// the deadline: only an answer is an outcome. within returns an error
// wrapping errDeadline when the deadline ended the call, one wrapping
// errStopping when ctx ended, else call's last error. A step whose call
// ended at the deadline records nothing: the runner's deadline of the phase
// (deadline.go) asks the driver what is true and settles it. An answer that
// comes after the deadline (a restore that failed after consuming the
// state, say) is still the driver's answer and is returned as it is: only
// a call the deadline cut short, or that got no answer, is errDeadline.
// name is the step, and the driver operation call is, in the metrics.
func (r *Runner) within(ctx context.Context, s *step, name string, retry func(error) bool, call func(context.Context) error) (err error) {
	defer r.timeStep(s, name, time.Now(), &err)
	at := s.intent.Time
	if at.IsZero() {
		at = time.Now()
	}
	dctx, cancel := context.WithDeadline(ctx, at.Add(r.cfg.Deadline))
	defer cancel()
	// ended is the error of a call, last failing with err, that ctx or the
	// deadline ended.
	ended := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", errStopping, ctx.Err())
		}
		return fmt.Errorf("%w after %s: %w", errDeadline, r.cfg.Deadline, err)
	}
	wait := backoffMin
	for {
		err := r.timed(s, name, func() error { return call(dctx) })
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ended(err)
		case dctx.Err() != nil && !answer(err, retry):
			return ended(err)
		case !retry(err):
			return err
		}
		s.log.Warn().Err(err).Dur("backoff", wait).Msg("driver call without an answer; calling again")
		if !s.pause(dctx, wait) {
			return ended(err)
		}
		wait = min(2*wait, backoffMax)
	}
}

// pause waits d, false if ctx ended first. The step's worker slot is
// given back meanwhile (issue 24, hole 10: a step backing off holds no
// slot another sandbox's step could use) and taken again before pause
// returns, whatever ctx says: the step's worker gives it back when the
// step ends.
func (s *step) pause(ctx context.Context, d time.Duration) bool {
	if s.slot == nil {
		return sleep(ctx, d)
	}
	<-s.slot
	defer func() { s.slot <- struct{}{} }()
	return sleep(ctx, d)
}

// answer says whether err, from a call that returned once its deadline had
// passed, is the driver's answer rather than the deadline's: not the call's
// context ending (here, or on a remote node, where it comes back as
// DEADLINE_EXCEEDED), and not a failure retry takes for no answer.
func answer(err error, retry func(error) bool) bool {
	return !retry(err) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) &&
		events.CodeOf(err) != events.CodeDeadlineExceeded
}

// unanswered says whether err is a driver call that got no answer: only
// those are called again.
func unanswered(err error) bool { return errors.Is(err, compute.ErrUnavailable) }

// unrefused says whether err is anything but the driver's refusal of the
// call (or its word that the sandbox is gone): a suspend or stop that failed
// for any other reason is called again, and never taken for a rejection.
func unrefused(err error) bool {
	return !errors.Is(err, compute.ErrRejected) && !errors.Is(err, compute.ErrUnimplemented) &&
		!errors.Is(err, compute.ErrResourceMissing)
}

// record appends evs as the outcome of s's intent, retrying with backoff what
// may succeed later. A refusal comes back wrapping errRefused at once.
func (r *Runner) record(ctx context.Context, s *step, evs ...events.Event) (err error) {
	defer r.timeStep(s, "record", time.Now(), &err)
	wait := backoffMin
	for attempt := 1; ; attempt++ {
		err := r.rec.Record(ctx, s.intent, actor, evs...)
		switch {
		case err == nil:
			s.log.Info().Str("step", "record").Str("outcome", evs[len(evs)-1].Type()).Msg("outcome recorded")
			return nil
		case events.CodeOf(err) == events.CodeFailedPrecondition:
			return fmt.Errorf("%w: %w", errRefused, err)
		case ctx.Err() != nil:
			return fmt.Errorf("%w: %w", errStopping, ctx.Err())
		case attempt == recordAttempts:
			return fmt.Errorf("record %s: %d attempts: %w", evs[0].Type(), attempt, err)
		}
		s.log.Warn().Err(err).Str("step", "record").Int("attempt", attempt).Msg("record failed; retrying")
		if !s.pause(ctx, wait) {
			return fmt.Errorf("%w: %w", errStopping, ctx.Err())
		}
		wait = min(2*wait, backoffMax)
	}
}

// recordOrDrop records evs; a refusal ends the step without compensation
// (nothing to undo) and is logged.
func (r *Runner) recordOrDrop(ctx context.Context, s *step, evs ...events.Event) error {
	err := r.record(ctx, s, evs...)
	if errors.Is(err, errRefused) {
		s.log.Info().Err(err).Str("step", "record").Msg("sandbox moved on; outcome dropped")
		return nil
	}
	return err
}

// compensate runs undo, the driver call op, with a fresh deadline (the
// phase's may have passed).
func (r *Runner) compensate(ctx context.Context, s *step, name, op string, undo func(context.Context) error) (err error) {
	defer r.timeStep(s, name, time.Now(), &err)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Deadline)
	defer cancel()
	if err := r.timed(s, op, func() error { return undo(cctx) }); err != nil {
		s.log.Warn().Err(err).Str("step", name).Msg("compensation failed; the intent comes again")
		return fmt.Errorf("compensate %s: %w", name, err)
	}
	s.log.Info().Str("step", name).Msg("compensated")
	return nil
}

// timeStep records the step name of s that began at start and ended with
// *err (metrics).
func (r *Runner) timeStep(s *step, name string, start time.Time, err *error) {
	r.cfg.Metrics.SagaStep(s.saga, name, outcome(*err), time.Since(start))
}

// outcome names how a step ended, in the metrics.
func outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, errDeadline):
		return "deadline"
	case errors.Is(err, errStopping):
		return "stopping"
	case errors.Is(err, errRefused):
		return "refused"
	case errors.Is(err, compute.ErrRejected):
		return "rejected"
	case errors.Is(err, compute.ErrUnimplemented):
		return "unimplemented"
	case errors.Is(err, compute.ErrResourceMissing):
		return "resource_missing"
	}
	return "error"
}

// timed makes one call, op, of s's driver and records how long it took
// and its code (metrics).
func (r *Runner) timed(s *step, op string, call func() error) error {
	start := time.Now()
	err := call()
	code := metrics.OK
	if err != nil {
		code = string(events.CodeOf(err))
	}
	r.cfg.Metrics.DriverCall(s.created.Driver, op, code, time.Since(start))
	return err
}

// createdOf returns env decoded if it is a sandbox.created, kept in the
// cache; nil for any other event, or one that does not decode (its step
// drops it).
func (r *Runner) createdOf(env events.Envelope) *events.Created {
	if env.Type != events.TypeCreated {
		return nil
	}
	e, err := env.Decode()
	if err != nil {
		return nil
	}
	c := e.(*events.Created)
	r.specs.put(env.SandboxID, c)
	return c
}

// created returns the sandbox.created event of env's sandbox (from the intent
// itself, which createdOf cached, the cache or the log), or nil if the log
// has none.
func (r *Runner) created(ctx context.Context, env events.Envelope, intent events.Event) (*events.Created, error) {
	if c, ok := intent.(*events.Created); ok {
		return c, nil
	}
	if c := r.specs.get(env.SandboxID); c != nil {
		return c, nil
	}
	all, err := r.src.Load(ctx, env.SandboxID, 0)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", env.SandboxID, err)
	}
	var c *events.Created
	for _, e := range all {
		if node := movedTo(e); node != "" && c != nil {
			c = onNode(c, node)
		}
		if e.Type != events.TypeCreated || c != nil {
			continue
		}
		d, err := e.Decode()
		if err != nil {
			return nil, fmt.Errorf("decode %s created: %w", env.SandboxID, err)
		}
		c = d.(*events.Created)
	}
	if c != nil {
		r.specs.put(env.SandboxID, c)
	}
	return c, nil
}

// drives says whether this runner drives the sandboxes on node.
func (r *Runner) drives(node string) bool {
	return node == r.cfg.Node || slices.Contains(r.cfg.Nodes, node)
}

// movedTo is the node env moves its sandbox to (its retained state consumed
// on another node), or "".
func movedTo(env events.Envelope) string {
	if env.Type != events.TypeRetainedStateConsumed {
		return ""
	}
	e, err := env.Decode()
	if err != nil {
		return ""
	}
	return e.(*events.RetainedStateConsumed).Node
}

// onNode is c as its sandbox stands once on node: a copy (a cached created
// is shared, never changed).
func onNode(c *events.Created, node string) *events.Created {
	cp := *c
	cp.Node = node
	return &cp
}

// moved follows a sandbox that env moves to another node in the cache of
// created events; r.mu is held.
func (r *Runner) moved(env events.Envelope) {
	if node := movedTo(env); node != "" {
		if c := r.specs.get(env.SandboxID); c != nil {
			r.specs.put(env.SandboxID, onNode(c, node))
		}
	}
}

// specCacheSize bounds the cache of sandbox.created events.
const specCacheSize = 4096

// specCache keeps the sandbox.created event of recently driven sandboxes,
// bounded; it evicts an arbitrary entry when full.
type specCache struct {
	mu  sync.Mutex
	max int
	m   map[string]*events.Created
}

func newSpecCache(max int) *specCache {
	return &specCache{max: max, m: map[string]*events.Created{}}
}

func (c *specCache) get(id string) *events.Created {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id]
}

func (c *specCache) put(id string, e *events.Created) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[id]; !ok && len(c.m) >= c.max {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[id] = e
}

func (c *specCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

// starts reports whether intent is a start's (a create, a start request):
// the intents whose saga records a failed start when there is no driver.
func starts(intent events.Event) bool {
	switch intent.(type) {
	case *events.Created, *events.StartRequested:
		return true
	}
	return false
}
