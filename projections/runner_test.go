package projections

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// source is a fake Source and Head: Subscribe hands envs to the handler once
// each, records what the handler returned, closes delivered and then blocks
// until ctx ends.
type source struct {
	envs      []events.Envelope
	last      uint64
	err       error // returned by Subscribe at once, if set
	delivered chan struct{}

	mu      sync.Mutex
	name    string
	results []error
}

func newSource(envs ...events.Envelope) *source {
	s := &source{envs: envs, delivered: make(chan struct{})}
	if len(envs) > 0 {
		s.last = envs[len(envs)-1].Seq
	}
	return s
}

func (s *source) Subscribe(ctx context.Context, name string, h events.Handler) error {
	if s.err != nil {
		return s.err
	}
	s.mu.Lock()
	s.name = name
	s.mu.Unlock()
	for _, e := range s.envs {
		err := h(ctx, e)
		s.mu.Lock()
		s.results = append(s.results, err)
		s.mu.Unlock()
	}
	close(s.delivered)
	<-ctx.Done()
	return ctx.Err()
}

func (s *source) LastSeq(context.Context) (uint64, error) { return s.last, nil }

// subscribeOnly hides LastSeq.
type subscribeOnly struct{ Source }

// projection is a fake Projection that fails the first fail[seq] applies of
// an event.
type projection struct {
	fail       map[uint64]int
	checkpoint uint64
	called     chan struct{} // gets a value on every Apply call, if not nil

	mu      sync.Mutex
	calls   map[uint64]int
	applied []uint64
}

var errBroken = errors.New("broken")

func (p *projection) Name() string { return "fake" }

func (p *projection) Apply(ctx context.Context, env events.Envelope) error {
	if p.called != nil {
		p.called <- struct{}{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls == nil {
		p.calls = map[uint64]int{}
	}
	p.calls[env.Seq]++
	if p.calls[env.Seq] <= p.fail[env.Seq] {
		return errBroken
	}
	p.applied = append(p.applied, env.Seq)
	return nil
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
	wait(t, src.delivered)

	if want := []uint64{1, 2, 5}; !reflect.DeepEqual(p.applied, want) {
		t.Errorf("applied %v, want %v", p.applied, want)
	}
	if src.name != "fake" {
		t.Errorf("durable name %q, want the projection's name", src.name)
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
}

func TestRunnerRetries(t *testing.T) {
	src := newSource(envs(t, 1, 2)...)
	p := &projection{fail: map[uint64]int{2: 2}}
	r := newRunner(t, src, p, fast)
	start(t, r)
	wait(t, src.delivered)

	if want := []error{nil, nil}; !reflect.DeepEqual(src.results, want) {
		t.Errorf("handler results %v, want %v", src.results, want)
	}
	if got := p.calls[2]; got != 3 {
		t.Errorf("apply calls of seq 2 = %d, want 3", got)
	}
	if got := r.Position(); got != 2 {
		t.Errorf("Position = %d, want 2", got)
	}
}

func TestRunnerGivesEventBack(t *testing.T) {
	src := newSource(envs(t, 1, 2)...)
	p := &projection{fail: map[uint64]int{2: 100}}
	cfg := fast
	cfg.Attempts = 3
	r := newRunner(t, src, p, cfg)
	start(t, r)
	wait(t, src.delivered)

	if err := src.results[1]; !errors.Is(err, errBroken) {
		t.Errorf("handler result for seq 2 = %v, want one wrapping the apply error", err)
	}
	if got := p.calls[2]; got != 3 {
		t.Errorf("apply calls of seq 2 = %d, want 3 attempts", got)
	}
	if got := r.Position(); got != 1 {
		t.Errorf("Position = %d, want 1", got)
	}
	if lag, _ := r.Lag(context.Background()); lag != 1 {
		t.Errorf("Lag = %d, want 1", lag)
	}
}

func TestRunnerStopsBackoffWhenCtxEnds(t *testing.T) {
	src := newSource(envs(t, 1)...)
	p := &projection{fail: map[uint64]int{1: 100}, called: make(chan struct{}, 1)}
	r := newRunner(t, src, p, Config{MinBackoff: time.Hour, MaxBackoff: time.Hour})
	stop := start(t, r)
	wait(t, p.called) // the first apply failed; the runner backs off for an hour
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	if err := src.results[0]; !errors.Is(err, errBroken) {
		t.Errorf("handler result = %v, want the apply error", err)
	}
}

func TestRunnerCheckpoint(t *testing.T) {
	src := newSource()
	src.last = 9
	r := newRunner(t, src, checkpointed{&projection{checkpoint: 7}}, fast)
	start(t, r)
	wait(t, src.delivered)
	if got := r.Position(); got != 7 {
		t.Errorf("Position = %d, want the checkpoint 7", got)
	}
	if lag, err := r.Lag(context.Background()); err != nil || lag != 2 {
		t.Errorf("Lag = %d, %v; want 2", lag, err)
	}
}

func TestRunnerSubscribeError(t *testing.T) {
	src := newSource()
	src.err = errors.New("no stream")
	r := newRunner(t, src, &projection{}, fast)
	if err := r.Run(context.Background()); !errors.Is(err, src.err) {
		t.Errorf("Run = %v, want the subscribe error", err)
	}
}

func TestRunnerLagNeedsHead(t *testing.T) {
	r := newRunner(t, subscribeOnly{newSource()}, &projection{}, fast)
	if _, err := r.Lag(context.Background()); err == nil {
		t.Error("Lag without a head = nil error, want one")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Attempts: -1}, {MinBackoff: -1}, {MinBackoff: 2 * time.Second, MaxBackoff: time.Second}} {
		if c.Validate() == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("Validate(zero) = %v", err)
	}
}

// batchSource is a source that is also an events.BatchSubscriber: it hands
// its batches to the handler once each, records the results, closes
// delivered and blocks until ctx ends.
type batchSource struct {
	*source
	batches [][]events.Envelope
	max     int
}

func (s *batchSource) SubscribeBatch(ctx context.Context, name string, max int, h events.BatchHandler) error {
	s.mu.Lock()
	s.name, s.max = name, max
	s.mu.Unlock()
	for _, b := range s.batches {
		err := h(ctx, b)
		s.mu.Lock()
		s.results = append(s.results, err)
		s.mu.Unlock()
	}
	close(s.delivered)
	<-ctx.Done()
	return nil
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

func TestRunnerAppliesBatches(t *testing.T) {
	all := envs(t, 1, 2, 3, 5, 8)
	src := &batchSource{source: newSource(), batches: [][]events.Envelope{all[:2], all[2:]}}
	src.last = 8
	p := &batchProjection{projection: &projection{fail: map[uint64]int{3: 2}}}
	cfg := fast
	cfg.BatchSize = 7
	r := newRunner(t, src, p, cfg)
	start(t, r)
	wait(t, src.delivered)

	if want := [][]uint64{{1, 2}, {3, 5, 8}}; !reflect.DeepEqual(p.batches, want) {
		t.Errorf("batches applied %v, want %v", p.batches, want)
	}
	if len(p.applied) != 0 {
		t.Errorf("per-event applies %v, want none", p.applied)
	}
	if want := []error{nil, nil}; !reflect.DeepEqual(src.results, want) {
		t.Errorf("handler results %v, want %v (the failing batch retried)", src.results, want)
	}
	if p.calls[3] != 3 {
		t.Errorf("calls of the batch at 3 = %d, want 3", p.calls[3])
	}
	if src.name != "fake" || src.max != 7 {
		t.Errorf("subscribed as %q with max %d, want fake, 7", src.name, src.max)
	}
	if got := r.Position(); got != 8 {
		t.Errorf("Position = %d, want 8", got)
	}
}

func TestRunnerGivesBatchBack(t *testing.T) {
	all := envs(t, 1, 2)
	src := &batchSource{source: newSource(), batches: [][]events.Envelope{all[:1], all[1:]}}
	p := &batchProjection{projection: &projection{fail: map[uint64]int{2: 100}}}
	cfg := fast
	cfg.Attempts = 3
	r := newRunner(t, src, p, cfg)
	start(t, r)
	wait(t, src.delivered)
	if err := src.results[1]; !errors.Is(err, errBroken) {
		t.Errorf("handler result of the second batch = %v, want the apply error", err)
	}
	if got := r.Position(); got != 1 {
		t.Errorf("Position = %d, want 1", got)
	}
}

func TestRunnerFallsBackToApply(t *testing.T) {
	plain, plain2 := newSource(envs(t, 1, 2)...), newSource(envs(t, 1, 2)...)
	tests := []struct {
		name string
		src  Source
		done chan struct{}
		p    interface {
			Projection
			applies() []uint64
		}
	}{
		{"batch source, per-event projection", &batchSource{source: plain}, plain.delivered, &projection{}},
		{"plain source, batch projection", plain2, plain2.delivered, &batchProjection{projection: &projection{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunner(t, tc.src, tc.p, fast)
			start(t, r)
			wait(t, tc.done)
			if got := tc.p.applies(); !reflect.DeepEqual(got, []uint64{1, 2}) {
				t.Errorf("per-event applies %v, want [1 2]", got)
			}
		})
	}
}

func (p *projection) applies() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applied
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
	wait(t, src.delivered)
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
