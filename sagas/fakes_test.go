package sagas_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/memstore"
	"github.com/torpor/torpor/services/compute"
)

// wait bounds every wait of these tests.
const wait = 10 * time.Second

// tracked is a memstore that tells waiters about appends and acknowledgements.
type tracked struct {
	*memstore.Store

	appendMu sync.Mutex // serialises appendNext

	mu      sync.Mutex
	acked   map[string]map[uint64]bool // durable name → acknowledged sequences
	changed chan struct{}              // closed and replaced on every change
}

func newTracked() *tracked {
	return &tracked{Store: memstore.New(), acked: map[string]map[uint64]bool{}, changed: make(chan struct{})}
}

func (s *tracked) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// Subscribe notes every acknowledged event.
func (s *tracked) Subscribe(ctx context.Context, name string, h events.Handler) error {
	return s.Store.Subscribe(ctx, name, func(ctx context.Context, env events.Envelope) error {
		err := h(ctx, env)
		if err == nil {
			s.mu.Lock()
			if s.acked[name] == nil {
				s.acked[name] = map[uint64]bool{}
			}
			s.acked[name][env.Seq] = true
			s.mu.Unlock()
			s.notify()
		}
		return err
	})
}

// appendNext appends envs after the sandbox's last event.
func (s *tracked) appendNext(ctx context.Context, id string, envs ...events.Envelope) ([]events.Envelope, error) {
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	old, err := s.Load(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	var last uint64
	if len(old) > 0 {
		last = old[len(old)-1].Seq
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
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitAcked waits until durable name acknowledged seq.
func (s *tracked) waitAcked(t *testing.T, name string, seq uint64) {
	t.Helper()
	s.waitUntil(t, fmt.Sprintf("%s to acknowledge %d", name, seq), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.acked[name][seq]
	})
}

// recorder is a Recorder that validates nothing: it appends what it is given
// (so the runner sees it) and notes every call. refuse, if set, makes it
// answer FAILED_PRECONDITION for the events it picks.
type recorder struct {
	store  *tracked
	refuse func(events.Event) bool
	// unavailable is how many calls fail with events.ErrUnavailable first.
	unavailable int

	mu    sync.Mutex
	calls [][]string // event types, per call
}

func (r *recorder) Record(ctx context.Context, cause events.Envelope, actor string, evs ...events.Event) error {
	types := make([]string, len(evs))
	for i, e := range evs {
		types[i] = e.Type()
	}
	r.mu.Lock()
	r.calls = append(r.calls, types)
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
	envs := make([]events.Envelope, len(evs))
	for i, e := range evs {
		env, err := events.NewEnvelope(cause.SandboxID, e, cause.Caused(actor), time.Now())
		if err != nil {
			return err
		}
		envs[i] = env
	}
	_, err := r.store.appendNext(ctx, cause.SandboxID, envs...)
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
// operation named block until the call's context ends, saying so on entered.
type counting struct {
	compute.Driver
	block   string
	entered chan string

	mu    sync.Mutex
	calls map[string]int
}

func newCounting(d compute.Driver, block string) *counting {
	return &counting{Driver: d, block: block, entered: make(chan string, 16), calls: map[string]int{}}
}

func (c *counting) enter(ctx context.Context, op string) error {
	c.mu.Lock()
	c.calls[op]++
	c.mu.Unlock()
	if op != c.block {
		return nil
	}
	c.entered <- op
	<-ctx.Done()
	return ctx.Err()
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
	return c.Driver.Start(ctx, req)
}

func (c *counting) Stop(ctx context.Context, t compute.Target) error {
	if err := c.enter(ctx, "stop"); err != nil {
		return err
	}
	return c.Driver.Stop(ctx, t)
}

func (c *counting) Suspend(ctx context.Context, t compute.Target) (string, error) {
	if err := c.enter(ctx, "suspend"); err != nil {
		return "", err
	}
	return c.Driver.Suspend(ctx, t)
}

func (c *counting) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	if err := c.enter(ctx, "resume"); err != nil {
		return compute.ResumeResult{}, err
	}
	return c.Driver.Resume(ctx, req)
}

func (c *counting) Discard(ctx context.Context, spec compute.Spec, ref string) error {
	if err := c.enter(ctx, "discard"); err != nil {
		return err
	}
	return c.Driver.Discard(ctx, spec, ref)
}

func (c *counting) Delete(ctx context.Context, spec compute.Spec) error {
	if err := c.enter(ctx, "delete"); err != nil {
		return err
	}
	return c.Driver.Delete(ctx, spec)
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
