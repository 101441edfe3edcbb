package sagas_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/memstore"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/gateway"
)

// wait bounds every wait of these tests.
const wait = 10 * time.Second

// tracked is a memstore that tells waiters about appends and about the
// runner's saved position.
type tracked struct {
	*memstore.Store

	appendMu sync.Mutex // serialises appendNext

	mu     sync.Mutex
	pos    uint64 // the runner's saved position
	loads  int    // Loads of the events after an intent (after > 0)
	handed uint64 // the last sequence the runner's Follow handler took
	// failFollow is how many Follow calls fail at once, and follows every
	// call's after.
	failFollow int
	follows    []uint64
	// breakAt, when set, ends the Follow with an error once the handler took
	// that sequence (once).
	breakAt uint64
	// splitAt, when set, hands a batch holding that sequence over in two:
	// up to it as the head of the log (pending 0), then, after splitPause,
	// the rest, as a reading of the log may when an atomic batch lands.
	splitAt    uint64
	splitPause time.Duration
	// loaded, when set, is called with every whole log of a sandbox Load
	// returns (after 0), before the caller gets it.
	loaded  func(id string, log []events.Envelope)
	changed chan struct{} // closed and replaced on every change
}

func newTracked() *tracked {
	return &tracked{Store: memstore.New(), changed: make(chan struct{})}
}

func (s *tracked) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// Load counts the loads of what followed an event.
func (s *tracked) Load(ctx context.Context, id string, after uint64) ([]events.Envelope, error) {
	s.mu.Lock()
	if after > 0 {
		s.loads++
	}
	loaded := s.loaded
	s.mu.Unlock()
	log, err := s.Store.Load(ctx, id, after)
	if err == nil && after == 0 && loaded != nil {
		loaded(id, log)
	}
	return log, err
}

// onLoad sets tracked.loaded.
func (s *tracked) onLoad(f func(id string, log []events.Envelope)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loaded = f
}

// timers is a sagas.Timers in memory, outliving the runners of a test as
// the KV bucket outlives processes.
type timers struct {
	mu     sync.Mutex
	keys   map[string]bool
	notify func() // when set, called on every change (a tracked store's: its waiters look again)
}

func newTimers() *timers { return &timers{keys: map[string]bool{}} }

func (t *timers) List(context.Context) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for k := range t.keys {
		out = append(out, k)
	}
	return out, nil
}

func (t *timers) Put(_ context.Context, k string) error {
	t.mu.Lock()
	t.keys[k] = true
	notify := t.notify
	t.mu.Unlock()
	if notify != nil {
		notify()
	}
	return nil
}

func (t *timers) Delete(_ context.Context, k string) error {
	t.mu.Lock()
	delete(t.keys, k)
	notify := t.notify
	t.mu.Unlock()
	if notify != nil {
		notify()
	}
	return nil
}

func (t *timers) has(k string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.keys[k]
}

// Follow notes the last sequence the handler took, once it returned.
func (s *tracked) Follow(ctx context.Context, after uint64, batch int, h events.FollowHandler) error {
	s.mu.Lock()
	s.follows = append(s.follows, after)
	fail := s.failFollow > 0
	if fail {
		s.failFollow--
	}
	s.mu.Unlock()
	s.notify()
	if fail {
		return fmt.Errorf("follow: %w", events.ErrUnavailable)
	}
	return s.Store.Follow(ctx, after, batch, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
		s.mu.Lock()
		split := s.splitAt
		s.mu.Unlock()
		for i, e := range envs {
			if split == 0 || e.Seq != split || i == len(envs)-1 {
				continue
			}
			if err := h(ctx, envs[:i+1], 0); err != nil {
				return err
			}
			time.Sleep(s.splitPause)
			envs = envs[i+1:]
			break
		}
		err := h(ctx, envs, pending)
		if err == nil && len(envs) > 0 {
			s.mu.Lock()
			s.handed = max(s.handed, envs[len(envs)-1].Seq)
			broken := s.breakAt > 0 && s.handed >= s.breakAt
			if broken {
				s.breakAt = 0
			}
			s.mu.Unlock()
			s.notify()
			if broken {
				return fmt.Errorf("connection lost: %w", events.ErrUnavailable)
			}
		}
		return err
	})
}

// followed is the last sequence the runner took from the log.
func (s *tracked) followed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handed
}

// laterLoads is how often the events after an event were loaded.
func (s *tracked) laterLoads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads
}

// position is the runner's sagas.Position, kept by the tracked store.
type position struct{ s *tracked }

func (p position) Get(context.Context) (uint64, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.s.pos, nil
}

func (p position) Set(_ context.Context, seq uint64) error {
	p.s.mu.Lock()
	p.s.pos = seq
	p.s.mu.Unlock()
	p.s.notify()
	return nil
}

// saved is the runner's last saved position.
func (s *tracked) saved() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pos
}

// appendNext appends envs after the sandbox's last event, each stamped with
// the phase the lifecycle table gives it, as the gateway stamps them. An
// event the table refuses there is refused as the gateway refuses it when
// strict (what the recorder appends); a test's own log may hold it
// (stamped with the phase it leaves as it is).
func (s *tracked) appendNext(ctx context.Context, id string, strict bool, envs ...events.Envelope) ([]events.Envelope, error) {
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	old, err := s.Store.Load(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	var last uint64
	phase := events.PhaseNone
	for _, env := range old { // through the table, as the aggregate folds, passing over what it refuses
		last = env.Seq
		if _, err := env.Decode(); err != nil {
			continue
		}
		if next, err := gateway.Next(phase, env.Type); err == nil {
			phase = next
		}
	}
	for i := range envs {
		next, err := gateway.Next(phase, envs[i].Type)
		switch {
		case err != nil && strict:
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: %v", id, err)
		case err != nil:
			next = phase
		}
		envs[i].Phase, phase = next, next
	}
	seq, err := s.Append(ctx, id, last, envs...)
	if err != nil {
		return nil, err
	}
	for i := range envs {
		envs[i].Seq = seq - uint64(len(envs)-1-i)
	}
	s.notify()
	return envs, nil
}

// waitUntil waits until cond holds, re-checking on every change.
func (s *tracked) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timeout := time.After(wait)
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-time.After(10 * time.Millisecond):
			// cond may read what no append changes (a driver's call
			// count): it is looked at again now and then, too.
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitPast waits until the runner saved a position at or past seq: every
// intent up to seq has finished its step.
func (s *tracked) waitPast(t *testing.T, seq uint64) {
	t.Helper()
	s.waitUntil(t, fmt.Sprintf("the saved position to reach %d", seq), func() bool { return s.saved() >= seq })
}

// recorder is a Recorder that validates nothing: it appends what it is given
// (so the runner sees it) and notes every call. refuse, if set, makes it
// answer FAILED_PRECONDITION for the events it picks.
type recorder struct {
	store  *tracked
	refuse func(events.Event) bool
	// expand, when set, is what the gateway appends for a reported event
	// (an expiry comes with the start of its action); nil keeps it as is.
	expand func(events.Event) []events.Event
	// unavailable is how many calls fail with events.ErrUnavailable first.
	unavailable int

	mu     sync.Mutex
	calls  [][]string        // event types, per call
	causes []events.Envelope // the cause of each call
}

func (r *recorder) Record(ctx context.Context, cause events.Envelope, actor string, evs ...events.Event) error {
	types := make([]string, len(evs))
	for i, e := range evs {
		types[i] = e.Type()
	}
	r.mu.Lock()
	r.calls = append(r.calls, types)
	r.causes = append(r.causes, cause)
	down := r.unavailable > 0
	if down {
		r.unavailable--
	}
	r.mu.Unlock()
	if down {
		return fmt.Errorf("record: %w", events.ErrUnavailable)
	}
	for _, e := range evs {
		if r.refuse != nil && r.refuse(e) {
			return events.Errorf(events.CodeFailedPrecondition, "sandbox %s: %s refused", cause.SandboxID, e.Type())
		}
	}
	// As the gateway has it: a consumption the log holds already for this
	// intent is not recorded again (a re-driven resume says it anew).
	logged, err := r.store.Load(ctx, cause.SandboxID, 0)
	if err != nil {
		return err
	}
	evs = slices.DeleteFunc(slices.Clone(evs), func(e events.Event) bool {
		return e.Type() == events.TypeRetainedStateConsumed && slices.ContainsFunc(logged, func(l events.Envelope) bool {
			return l.Type == events.TypeRetainedStateConsumed && l.CausationID == cause.ID
		})
	})
	if len(evs) == 0 {
		return nil
	}
	if r.expand != nil {
		var out []events.Event
		for _, e := range evs {
			if more := r.expand(e); more != nil {
				out = append(out, more...)
				continue
			}
			out = append(out, e)
		}
		evs = out
	}
	envs := make([]events.Envelope, len(evs))
	for i, e := range evs {
		env, err := events.NewEnvelope(cause.SandboxID, e, cause.Caused(actor), time.Now())
		if err != nil {
			return err
		}
		envs[i] = env
	}
	_, err = r.store.appendNext(ctx, cause.SandboxID, true, envs...)
	return err
}

func (r *recorder) callsOf(typ string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		for _, t := range c {
			if t == typ {
				n++
			}
		}
	}
	return n
}

// counting wraps a driver, counts its calls per operation, and blocks the
// operation named block until the call's context ends (or release is
// closed: then the call goes on to the driver), saying so on entered.
type counting struct {
	full
	block   string
	entered chan string
	release chan struct{}
	// observed, when set, is what Observe answers instead of the driver
	// (an error: the driver cannot say).
	observed func() (compute.Observation, error)
	// unavailable is how many calls answer compute.ErrUnavailable before
	// any reaches the driver.
	unavailable int
	// stubborn makes the operation named block ignore its call's context:
	// it waits for release alone, holding whatever its caller holds.
	stubborn bool
	// unreachable, while set, makes every call (Observe too) answer
	// compute.ErrUnavailable: the driver's node is cut off.
	unreachable bool
	// mute names an operation every call of which answers
	// compute.ErrUnavailable.
	mute string
	// notify, when set, is called after every call is counted (a tracked
	// store's notify: its waiters look again).
	notify func()
	// lose names the operation whose answer is lost: the call reaches the
	// driver, which does what it does, and then answers nothing until the
	// call's context ends.
	lose string

	mu    sync.Mutex
	calls map[string]int
}

// full is a driver with every optional interface the sagas use, as the sim is.
type full interface {
	compute.Driver
	compute.Suspender
	compute.Observer
}

func newCounting(d full, block string) *counting {
	return &counting{full: d, block: block, entered: make(chan string, 16), release: make(chan struct{}), calls: map[string]int{}}
}

func (c *counting) enter(ctx context.Context, op string) error {
	c.mu.Lock()
	c.calls[op]++
	down := c.unavailable > 0 || c.unreachable || op == c.mute
	if c.unavailable > 0 {
		c.unavailable--
	}
	stubborn, notify := c.stubborn, c.notify
	c.mu.Unlock()
	if notify != nil {
		notify()
	}
	if down {
		return fmt.Errorf("%s: no answer: %w", op, compute.ErrUnavailable)
	}
	if op != c.block {
		return nil
	}
	c.entered <- op
	if stubborn {
		<-c.release
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.release:
		return nil
	}
}

// setUnreachable cuts the driver off (every call unanswered) or heals it.
func (c *counting) setUnreachable(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unreachable = down
}

// after tells the waiters that a call the driver took has ended.
func (c *counting) after() {
	c.mu.Lock()
	notify := c.notify
	c.mu.Unlock()
	if notify != nil {
		notify()
	}
}

func (c *counting) count(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[op]
}

func (c *counting) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.calls {
		n += v
	}
	return n
}

func (c *counting) Start(ctx context.Context, req compute.Start) error {
	if err := c.enter(ctx, "start"); err != nil {
		return err
	}
	return c.full.Start(ctx, req)
}

func (c *counting) Stop(ctx context.Context, t compute.Target) error {
	if err := c.enter(ctx, "stop"); err != nil {
		return err
	}
	return c.full.Stop(ctx, t)
}

func (c *counting) Suspend(ctx context.Context, t compute.Target) (string, error) {
	if err := c.enter(ctx, "suspend"); err != nil {
		return "", err
	}
	defer c.after()
	return c.full.Suspend(ctx, t)
}

func (c *counting) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	if err := c.enter(ctx, "resume"); err != nil {
		return compute.ResumeResult{}, err
	}
	defer c.after()
	res, err := c.full.Resume(ctx, req)
	if c.lose == "resume" {
		<-ctx.Done()
		return compute.ResumeResult{}, ctx.Err()
	}
	return res, err
}

func (c *counting) Discard(ctx context.Context, spec compute.Spec, ref string) error {
	if err := c.enter(ctx, "discard"); err != nil {
		return err
	}
	defer c.after()
	return c.full.Discard(ctx, spec, ref)
}

func (c *counting) Delete(ctx context.Context, spec compute.Spec) error {
	if err := c.enter(ctx, "delete"); err != nil {
		return err
	}
	return c.full.Delete(ctx, spec)
}

// reports collects the sim's supervisor reports without ever blocking it.
type reports struct {
	mu      sync.Mutex
	all     []compute.Report
	arrived chan struct{} // closed and replaced on every report
}

func (r *reports) Report(ctx context.Context, rep compute.Report) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rep)
	if r.arrived != nil {
		close(r.arrived)
	}
	r.arrived = make(chan struct{})
	return nil
}

// waitFor waits until at least n reports arrived.
func (r *reports) waitFor(t *testing.T, n int) []compute.Report {
	t.Helper()
	timeout := time.After(wait)
	for {
		r.mu.Lock()
		if len(r.all) >= n {
			all := append([]compute.Report(nil), r.all...)
			r.mu.Unlock()
			return all
		}
		if r.arrived == nil {
			r.arrived = make(chan struct{})
		}
		ch := r.arrived
		r.mu.Unlock()
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("timed out waiting for %d supervisor reports", n)
		}
	}
}

func (r *reports) list() []compute.Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]compute.Report(nil), r.all...)
}

// Observe forwards to the wrapped driver, which the sim is (a wrapper must
// forward the optional interfaces it means to keep).
func (c *counting) Observe(ctx context.Context, spec compute.Spec) (compute.Observation, error) {
	c.mu.Lock()
	c.calls["observe"]++
	observed, down := c.observed, c.unreachable
	c.mu.Unlock()
	if down {
		return compute.Observation{}, fmt.Errorf("observe: no answer: %w", compute.ErrUnavailable)
	}
	if observed != nil {
		return observed()
	}
	return c.full.Observe(ctx, spec)
}
