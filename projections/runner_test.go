package projections

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// source is a fake Source and Head. Each Follow call first runs onFollow,
// if set. Its first down calls fail at once with errDown; every other call hands the envs above after to the
// handler in batches of up to max, returns the first error the handler
// returns, or else blocks until ctx ends and returns nil. Each call is
// recorded and sent on followed (unless ctx ends first) when it is done
// delivering.
type source struct {
	envs     []events.Envelope
	last     uint64
	down     int
	onFollow func()
	followed chan call

	mu    sync.Mutex
	calls []call
}

// call is one Follow call as the source saw it.
type call struct {
	after   uint64
	max     int
	pending []uint64 // handed to the handler, a batch at a time
	results []error  // what the handler returned, a batch at a time
	err     error    // what Follow returned before ctx ended, if anything
}

var (
	errBroken = errors.New("broken")
	errDown   = errors.New("log unavailable")
)

func newSource(envs ...events.Envelope) *source {
	s := &source{envs: envs, followed: make(chan call)}
	if len(envs) > 0 {
		s.last = envs[len(envs)-1].Seq
	}
	return s
}

func (s *source) Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error {
	if s.onFollow != nil {
		s.onFollow()
	}
	c := call{after: after, max: max}
	c.err = s.deliver(ctx, &c, h)
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	select {
	case s.followed <- c:
	case <-ctx.Done():
	}
	if c.err != nil {
		return c.err
	}
	<-ctx.Done()
	return nil
}

func (s *source) deliver(ctx context.Context, c *call, h events.FollowHandler) error {
	s.mu.Lock()
	down := s.down > 0
	if down {
		s.down--
	}
	s.mu.Unlock()
	switch {
	case down:
		return errDown
	case c.max < 1:
		return fmt.Errorf("max %d: want at least 1", c.max)
	}
	var rest []events.Envelope
	for i, e := range s.envs {
		if e.Seq > c.after {
			rest = s.envs[i:]
			break
		}
	}
	for len(rest) > 0 {
		n := min(len(rest), c.max)
		pending := uint64(len(rest) - n)
		err := h(ctx, rest[:n:n], pending)
		c.pending = append(c.pending, pending)
		c.results = append(c.results, err)
		if err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

func (s *source) LastSeq(context.Context) (uint64, error) { return s.last, nil }

// next waits for the next Follow call to be done delivering.
func (s *source) next(t *testing.T) call {
	t.Helper()
	select {
	case c := <-s.followed:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no Follow call done in 10s")
		return call{}
	}
}

// followCalls is every Follow call so far.
func (s *source) followCalls() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]call(nil), s.calls...)
}

// followOnly hides LastSeq.
type followOnly struct{ Source }

// projection is a fake Projection that fails the first fail[seq] applies of
// an event.
type projection struct {
	fail       map[uint64]int
	never      map[uint64]bool // seqs it cannot apply (ErrUnapplicable)
	checkpoint uint64
	called     chan struct{} // gets a value on every Apply call, if not nil

	mu      sync.Mutex
	calls   map[uint64]int
	at      map[uint64][]time.Time // when each Apply of a seq started
	applied []uint64
}

func (p *projection) Name() string { return "fake" }

func (p *projection) Apply(ctx context.Context, env events.Envelope) error {
	if p.called != nil {
		p.called <- struct{}{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls == nil {
		p.calls, p.at = map[uint64]int{}, map[uint64][]time.Time{}
	}
	p.calls[env.Seq]++
	p.at[env.Seq] = append(p.at[env.Seq], time.Now())
	if p.calls[env.Seq] <= p.fail[env.Seq] {
		return errBroken
	}
	if p.never[env.Seq] {
		return fmt.Errorf("seq %d: %w", env.Seq, ErrUnapplicable)
	}
	p.applied = append(p.applied, env.Seq)
	return nil
}

func (p *projection) applies() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applied
}

// checkpointed is a projection that is also a Checkpointer.
type checkpointed struct{ *projection }

func (p checkpointed) Checkpoint(context.Context) (uint64, error) { return p.checkpoint, nil }

func envs(t *testing.T, seqs ...uint64) []events.Envelope {
	t.Helper()
	var out []events.Envelope
	for _, s := range seqs {
		e, err := events.NewEnvelope("sb", &events.SupervisorAttached{Generation: 1}, events.Meta{}, time.Now())
		if err != nil {
			t.Fatalf("envelope: %v", err)
		}
		e.Seq = s
		out = append(out, e)
	}
	return out
}

var fast = Config{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

// start runs r until the test ends and returns a function that stops it and
// returns Run's error.
func start(t *testing.T, r *Runner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return in 10s after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func wait(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out")
	}
}

func newRunner(t *testing.T, src Source, p Projection, cfg Config) *Runner {
	t.Helper()
	r, err := NewRunner(src, p, cfg)
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	return r
}

func TestRunnerApplies(t *testing.T) {
	src := newSource(envs(t, 1, 2, 5)...)
	p := &projection{}
	r := newRunner(t, src, p, fast)
	stop := start(t, r)
	c := src.next(t)

	if c.after != 0 || c.max != 1000 {
		t.Errorf("followed after %d with max %d, want after 0 with the default batch size 1000", c.after, c.max)
	}
	if want := []error{nil}; !reflect.DeepEqual(c.results, want) {
		t.Errorf("handler results %v, want %v", c.results, want)
	}
	if want := []uint64{1, 2, 5}; !reflect.DeepEqual(p.applies(), want) {
		t.Errorf("applied %v, want %v", p.applies(), want)
	}
	if got := r.Position(); got != 5 {
		t.Errorf("Position = %d, want 5", got)
	}
	if lag, err := r.Lag(context.Background()); err != nil || lag != 0 {
		t.Errorf("Lag = %d, %v; want 0", lag, err)
	}
	src.last = 9
	if lag, err := r.Lag(context.Background()); err != nil || lag != 4 {
		t.Errorf("Lag behind head 9 = %d, %v; want 4", lag, err)
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil when ctx ends", err)
	}
	if n := len(src.followCalls()); n != 1 {
		t.Errorf("%d Follow calls, want 1", n)
	}
}

// TestRunnerParks: an event the projection can never apply is not retried
// and does not hold up the rest: it is counted as parked (a projection that
// is no Parker records nothing of it) and the position moves past it.
func TestRunnerParks(t *testing.T) {
	src := newSource(envs(t, 1, 2, 5)...)
	p := &projection{never: map[uint64]bool{2: true}}
	r := newRunner(t, src, p, fast)
	stop := start(t, r)
	src.next(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	calls := p.calls[2]
	p.mu.Unlock()
	if want := []uint64{1, 5}; !reflect.DeepEqual(p.applies(), want) || r.Parked() != 1 || r.Position() != 5 || calls != 1 {
		t.Errorf("applied %v, parked %d, position %d, seq 2 tried %d times; want [1 5], 1, 5, once", p.applies(), r.Parked(), r.Position(), calls)
	}
}

// TestRunnerRetries: a failing apply is retried in place, after a backoff
// that starts at MinBackoff and doubles up to MaxBackoff, until it succeeds.
func TestRunnerRetries(t *testing.T) {
	src := newSource(envs(t, 1, 2)...)
	p := &projection{fail: map[uint64]int{2: 3}}
	cfg := Config{MinBackoff: 4 * time.Millisecond, MaxBackoff: 6 * time.Millisecond}
	r := newRunner(t, src, p, cfg)
	start(t, r)
	c := src.next(t)

	if want := []error{nil}; !reflect.DeepEqual(c.results, want) {
		t.Errorf("handler results %v, want %v", c.results, want)
	}
	if got := p.calls[2]; got != 4 {
		t.Errorf("apply calls of seq 2 = %d, want 4", got)
	}
	if want := []uint64{1, 2}; !reflect.DeepEqual(p.applied, want) {
		t.Errorf("applied %v, want %v", p.applied, want)
	}
	if got := r.Position(); got != 2 {
		t.Errorf("Position = %d, want 2", got)
	}
	backoffs := []time.Duration{4 * time.Millisecond, 6 * time.Millisecond, 6 * time.Millisecond}
	for i, at := range p.at[2][1:] {
		if gap := at.Sub(p.at[2][i]); gap < backoffs[i] {
			t.Errorf("apply %d of seq 2 came %v after the one before, want at least %v", i+2, gap, backoffs[i])
		}
	}
}

// TestRunnerFollowsAgainAfterAttempts: an event that fails Attempts times
// ends the reading of the log; the runner follows it again from the last
// event applied, and the event is applied then.
func TestRunnerFollowsAgainAfterAttempts(t *testing.T) {
	src := newSource(envs(t, 1, 2)...)
	p := &projection{fail: map[uint64]int{2: 3}}
	cfg := fast
	cfg.Attempts = 3
	var tries []int // applies of seq 2 when each Follow call began
	src.onFollow = func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		tries = append(tries, p.calls[2])
	}
	r := newRunner(t, src, p, cfg)
	stop := start(t, r)

	first := src.next(t)
	if len(first.results) != 1 || !errors.Is(first.err, errBroken) {
		t.Errorf("first Follow: handler results %v, Follow = %v; want one batch failing with the apply error", first.results, first.err)
	}
	second := src.next(t)
	if want := []int{0, 3}; !reflect.DeepEqual(tries, want) {
		t.Errorf("applies of seq 2 before each Follow %v, want %v (3 attempts in the first reading)", tries, want)
	}
	if second.after != 1 {
		t.Errorf("second Follow after %d, want 1 (the last applied)", second.after)
	}
	if want := []error{nil}; !reflect.DeepEqual(second.results, want) {
		t.Errorf("second Follow: handler results %v, want %v", second.results, want)
	}
	if want := []uint64{1, 2}; !reflect.DeepEqual(p.applies(), want) {
		t.Errorf("applied %v, want %v", p.applies(), want)
	}
	if got, want := p.calls, map[uint64]int{1: 1, 2: 4}; !reflect.DeepEqual(got, want) {
		t.Errorf("apply calls %v, want %v", got, want)
	}
	if got := r.Position(); got != 2 {
		t.Errorf("Position = %d, want 2", got)
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

func TestRunnerStopsBackoffWhenCtxEnds(t *testing.T) {
	src := newSource(envs(t, 1)...)
	p := &projection{fail: map[uint64]int{1: 100}, called: make(chan struct{}, 1)}
	r := newRunner(t, src, p, Config{MinBackoff: time.Hour, MaxBackoff: time.Hour})
	stop := start(t, r)
	wait(t, p.called) // the first apply failed; the runner backs off for an hour
	began := time.Now()
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Run returned %v after cancel, want at once", took)
	}
	calls := src.followCalls()
	if len(calls) != 1 || len(calls[0].results) != 1 || !errors.Is(calls[0].results[0], errBroken) {
		t.Fatalf("Follow calls %+v, want one whose handler returned the apply error", calls)
	}
	if got := p.calls[1]; got != 1 {
		t.Errorf("apply calls = %d, want 1", got)
	}
}

// TestRunnerCheckpoint: a Checkpointer is followed from its checkpoint, and
// Position and Lag report it before any event arrives.
func TestRunnerCheckpoint(t *testing.T) {
	src := newSource(envs(t, 5, 7)...)
	src.last = 9
	p := &projection{checkpoint: 7}
	r := newRunner(t, src, checkpointed{p}, fast)
	start(t, r)
	c := src.next(t)

	if c.after != 7 {
		t.Errorf("followed after %d, want the checkpoint 7", c.after)
	}
	if len(p.applies()) != 0 {
		t.Errorf("applied %v, want nothing at or below the checkpoint", p.applies())
	}
	if got := r.Position(); got != 7 {
		t.Errorf("Position = %d, want the checkpoint 7", got)
	}
	if lag, err := r.Lag(context.Background()); err != nil || lag != 2 {
		t.Errorf("Lag = %d, %v; want 2", lag, err)
	}
}

// TestRunnerFollowsAgainWhenSourceFails: a Follow that fails is not the end
// of Run: it follows again until the source recovers.
func TestRunnerFollowsAgainWhenSourceFails(t *testing.T) {
	src := newSource(envs(t, 1, 2)...)
	src.down = 2
	p := &projection{}
	r := newRunner(t, src, p, fast)
	stop := start(t, r)

	for i := range 2 {
		if c := src.next(t); !errors.Is(c.err, errDown) || c.after != 0 || len(c.results) != 0 {
			t.Errorf("Follow %d = %+v, want errDown after 0 with no handler call", i+1, c)
		}
	}
	if c := src.next(t); c.after != 0 || !reflect.DeepEqual(c.results, []error{nil}) {
		t.Errorf("Follow after recovery = %+v, want after 0 and one batch handled", c)
	}
	if want := []uint64{1, 2}; !reflect.DeepEqual(p.applies(), want) {
		t.Errorf("applied %v, want %v", p.applies(), want)
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil when ctx ends", err)
	}
}

func TestRunnerLagNeedsHead(t *testing.T) {
	r := newRunner(t, followOnly{newSource()}, &projection{}, fast)
	if _, err := r.Lag(context.Background()); err == nil {
		t.Error("Lag without a head = nil error, want one")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []struct {
		name string
		cfg  Config
	}{
		{"negative attempts", Config{Attempts: -1}},
		{"negative batch size", Config{BatchSize: -1}},
		{"negative min backoff", Config{MinBackoff: -1}},
		{"negative max backoff", Config{MaxBackoff: -1}},
		{"min backoff above max", Config{MinBackoff: 2 * time.Second, MaxBackoff: time.Second}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cfg.Validate() == nil {
				t.Errorf("Validate(%+v) = nil, want an error", tc.cfg)
			}
			if _, err := NewRunner(newSource(), &projection{}, tc.cfg); err == nil {
				t.Errorf("NewRunner with %+v = nil error, want one", tc.cfg)
			}
		})
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("Validate(zero) = %v", err)
	}
}

// batchProjection is a projection that also applies batches; it fails the
// first fail[first seq] calls of a batch.
type batchProjection struct {
	*projection
	batches [][]uint64
}

func (p *batchProjection) ApplyBatch(ctx context.Context, envs []events.Envelope) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls == nil {
		p.calls = map[uint64]int{}
	}
	first := envs[0].Seq
	p.calls[first]++
	if p.calls[first] <= p.fail[first] {
		return errBroken
	}
	var seqs []uint64
	for _, e := range envs {
		seqs = append(seqs, e.Seq)
	}
	p.batches = append(p.batches, seqs)
	return nil
}

// TestRunnerAppliesBatches: a BatchProjection gets the log in order, in
// batches of at most BatchSize, each retried in place when it fails.
func TestRunnerAppliesBatches(t *testing.T) {
	src := newSource(envs(t, 1, 2, 3, 5, 8)...)
	p := &batchProjection{projection: &projection{fail: map[uint64]int{3: 2}}}
	cfg := fast
	cfg.BatchSize = 2
	r := newRunner(t, src, p, cfg)
	start(t, r)
	c := src.next(t)

	if c.max != 2 {
		t.Errorf("followed with max %d, want the batch size 2", c.max)
	}
	if want := [][]uint64{{1, 2}, {3, 5}, {8}}; !reflect.DeepEqual(p.batches, want) {
		t.Errorf("batches applied %v, want %v", p.batches, want)
	}
	if len(p.applied) != 0 {
		t.Errorf("per-event applies %v, want none", p.applied)
	}
	if want := []error{nil, nil, nil}; !reflect.DeepEqual(c.results, want) {
		t.Errorf("handler results %v, want %v (the failing batch retried)", c.results, want)
	}
	if p.calls[3] != 3 {
		t.Errorf("calls of the batch at 3 = %d, want 3", p.calls[3])
	}
	if got := r.Position(); got != 8 {
		t.Errorf("Position = %d, want 8", got)
	}
}

// TestRunnerFollowsAgainAfterBatchAttempts: a batch that fails Attempts
// times is followed again from the last event applied, and applied then.
func TestRunnerFollowsAgainAfterBatchAttempts(t *testing.T) {
	src := newSource(envs(t, 1, 2, 3, 5)...)
	p := &batchProjection{projection: &projection{fail: map[uint64]int{3: 3}}}
	cfg := fast
	cfg.Attempts = 3
	cfg.BatchSize = 2
	r := newRunner(t, src, p, cfg)
	start(t, r)

	first := src.next(t)
	if len(first.results) != 2 || first.results[0] != nil || !errors.Is(first.err, errBroken) {
		t.Errorf("first Follow: handler results %v, Follow = %v; want the second batch failing with the apply error", first.results, first.err)
	}
	second := src.next(t)
	if second.after != 2 {
		t.Errorf("second Follow after %d, want 2 (the last applied)", second.after)
	}
	if want := []error{nil}; !reflect.DeepEqual(second.results, want) {
		t.Errorf("second Follow: handler results %v, want %v", second.results, want)
	}
	if want := [][]uint64{{1, 2}, {3, 5}}; !reflect.DeepEqual(p.batches, want) {
		t.Errorf("batches applied %v, want %v", p.batches, want)
	}
	if got, want := p.calls, map[uint64]int{1: 1, 3: 4}; !reflect.DeepEqual(got, want) {
		t.Errorf("batch calls by first seq %v, want %v", got, want)
	}
	if got := r.Position(); got != 5 {
		t.Errorf("Position = %d, want 5", got)
	}
}

// TestRunnerFallsBackToApply: a projection without ApplyBatch gets one Apply
// per event of every batch.
func TestRunnerFallsBackToApply(t *testing.T) {
	src := newSource(envs(t, 1, 2, 3)...)
	p := &projection{}
	cfg := fast
	cfg.BatchSize = 2
	r := newRunner(t, src, p, cfg)
	start(t, r)
	c := src.next(t)

	if want := []error{nil, nil}; !reflect.DeepEqual(c.results, want) {
		t.Errorf("handler results %v, want %v (two batches)", c.results, want)
	}
	if want := []uint64{1, 2, 3}; !reflect.DeepEqual(p.applies(), want) {
		t.Errorf("per-event applies %v, want %v", p.applies(), want)
	}
	if got := r.Position(); got != 3 {
		t.Errorf("Position = %d, want 3", got)
	}
}

// flushed is a projection that is also a Flusher, counting its flushes.
type flushed struct {
	*projection
	flushes chan struct{}
}

func (p flushed) Flush(context.Context) error {
	p.flushes <- struct{}{}
	return nil
}

// TestRunnerFlushesWhenItStops: a Flusher's held-back writes are written when
// the runner stops, once, after the last apply.
func TestRunnerFlushesWhenItStops(t *testing.T) {
	src := newSource(envs(t, 1, 2)...)
	p := flushed{projection: &projection{}, flushes: make(chan struct{}, 2)}
	r := newRunner(t, src, p, fast)
	stop := start(t, r)
	src.next(t)
	if len(p.flushes) != 0 {
		t.Fatal("flushed while running")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := len(p.flushes); got != 1 {
		t.Fatalf("%d flushes after stop, want 1", got)
	}
}

// TestRunnerStuckWhileRetrying: while the apply of one event fails and is
// retried, the runner says it is stuck (for /readyz); once it applies,
// it is not.
func TestRunnerStuckWhileRetrying(t *testing.T) {
	src := newSource(envs(t, 1, 2)...)
	p := &projection{fail: map[uint64]int{2: 3}, called: make(chan struct{})}
	r := newRunner(t, src, p, fast)
	start(t, r)
	if err := r.Stuck(); err != nil {
		t.Fatalf("Stuck before any apply: %v", err)
	}
	for range 3 { // seq 1, seq 2 failing, seq 2 again: held in that retry
		wait(t, p.called)
	}
	if err := r.Stuck(); err == nil {
		t.Error("Stuck = nil while seq 2 is retried")
	}
	for range 2 {
		wait(t, p.called)
	}
	src.next(t)
	if err := r.Stuck(); err != nil {
		t.Errorf("Stuck after seq 2 applied: %v", err)
	}
}

// TestRunnerFollowsAgainSoonAfterALostReading: a reading of the log that
// fails (its NATS server died) is followed again after MinBackoff, not
// MaxBackoff: the wait doubles only while readings keep failing. Here
// MaxBackoff is an hour: a runner that waited it would never apply the
// events the second reading brings.
func TestRunnerFollowsAgainSoonAfterALostReading(t *testing.T) {
	src := newSource(envs(t, 1, 2)...)
	src.down = 2
	p := &projection{}
	r := newRunner(t, src, p, Config{MinBackoff: time.Millisecond, MaxBackoff: time.Hour})
	start(t, r)
	for _, want := range []error{errDown, errDown, nil} {
		if c := src.next(t); !errors.Is(c.err, want) {
			t.Fatalf("reading ended with %v, want %v", c.err, want)
		}
	}
	if want := []uint64{1, 2}; !reflect.DeepEqual(p.applies(), want) {
		t.Errorf("applied %v, want %v", p.applies(), want)
	}
}
