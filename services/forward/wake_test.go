package forward_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/services/forward"
)

// waking is the test's Sandboxes with a Waker: every sandbox wakes on
// traffic; a resume asked for blocks until the test releases it, then
// makes the sandbox ready (or leaves it suspended when fail).
type waking struct {
	*sandboxes
	release chan struct{}
	fail    bool

	mu      sync.Mutex
	asked   []string // the keys of the resumes asked for
	gen     int64    // 1, 2 once a resume ran
	outcome string
}

func (w *waking) State(_ context.Context, id string) (forward.State, error) {
	w.sandboxes.mu.Lock()
	defer w.sandboxes.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	return forward.State{Phase: w.phase[id], Generation: w.gen, WakeOnTraffic: true, LastOutcome: w.outcome}, nil
}

func (w *waking) Resume(ctx context.Context, id, fid string, gen int64) error {
	w.mu.Lock()
	w.asked = append(w.asked, forward.WakeKey(gen))
	w.mu.Unlock()
	select {
	case <-w.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	w.mu.Lock()
	w.gen = 2 // the resume's generation, whatever its outcome
	if w.fail {
		w.outcome = events.OutcomeRestoreFailed
	}
	w.mu.Unlock()
	if !w.fail {
		w.set(id, events.PhaseReady)
	}
	return nil
}

func (w *waking) askedN() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.asked)
}

func wakingForwarder(t *testing.T, cfg forward.Config) (*waking, string, *metrics.Set) {
	t.Helper()
	w := &waking{sandboxes: &sandboxes{phase: map[string]events.Phase{"s1": events.PhaseReady}, closed: map[string]bool{}, ports: map[int]string{8000: echo(t)}},
		release: make(chan struct{}), gen: 1}
	m := metrics.New()
	cfg.Poll, cfg.Metrics = 5*time.Millisecond, m
	f := forward.New(w, kvIndex(t), cfg, zerolog.Nop())
	t.Cleanup(f.Shut)
	t.Cleanup(func() {
		select {
		case <-w.release:
		default:
			close(w.release)
		}
	})
	addr, err := f.Bind(context.Background(), "s1", "fw-1", "127.0.0.1:0", 8000, true)
	if err != nil {
		t.Fatal(err)
	}
	f.Serve("fw-1")
	w.set("s1", events.PhaseSuspended)
	return w, addr, m
}

// until polls cond (the forwarder's goroutines hold the state) for 10s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// TestWakeHoldsUpToTheLimit: the connections to a sandbox that wakes on
// traffic are held while its resume runs, up to MaxHeld; one more is
// refused at once, with the line why; once the sandbox is ready the held
// ones are carried; the wakes are counted by outcome and their latency
// observed.
func TestWakeHoldsUpToTheLimit(t *testing.T) {
	w, addr, m := wakingForwarder(t, forward.Config{MaxHeld: 2, WakeTimeout: time.Minute})
	held := make(chan string, 2)
	for _, line := range []string{"one", "two"} {
		go func() { held <- say(t, addr, line) }()
	}
	until(t, "two connections held, each asking for the resume", func() bool { return w.askedN() == 2 })
	start := time.Now()
	if got := say(t, addr, "three"); got != "torpor: sandbox s1 is waking; 2 connections are held for it already, the connection is refused" {
		t.Fatalf("a connection past the limit: %q", got)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the refusal took %s, want it at once", d)
	}
	close(w.release)
	got := []string{<-held, <-held}
	if !(got[0] == "echo: one" && got[1] == "echo: two" || got[0] == "echo: two" && got[1] == "echo: one") {
		t.Fatalf("the held connections got %q", got)
	}
	if w.asked[0] != w.asked[1] {
		t.Fatalf("the resumes asked with keys %q, want one key for one suspension", w.asked)
	}
	for outcome, want := range map[string]float64{forward.WakeWoken: 2, forward.WakeLimit: 1} {
		if n := wakes(t, m, outcome); n != want {
			t.Errorf("torpor_wakes_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
	if n := histogramCount(t, m, "torpor_wake_seconds"); n != 2 {
		t.Errorf("torpor_wake_seconds observed %d wakes, want 2", n)
	}
}

// TestWakeFailsOrTimesOut: a resume that leaves the sandbox suspended
// refuses the held connection with the line why; a sandbox not ready
// within WakeTimeout refuses it too.
func TestWakeFailsOrTimesOut(t *testing.T) {
	t.Run("failed", func(t *testing.T) {
		w, addr, m := wakingForwarder(t, forward.Config{WakeTimeout: time.Minute})
		w.fail = true
		close(w.release)
		got := say(t, addr, "anyone?")
		if want := "torpor: sandbox s1 did not wake: its resume failed (restore_failed); it stays suspended"; got != want {
			t.Fatalf("a connection whose resume failed: %q, want %q", got, want)
		}
		if n := wakes(t, m, forward.WakeFailed); n != 1 {
			t.Errorf("torpor_wakes_total{outcome=failed} = %v, want 1", n)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		_, addr, m := wakingForwarder(t, forward.Config{WakeTimeout: 100 * time.Millisecond})
		got := say(t, addr, "anyone?")
		if !strings.HasPrefix(got, "torpor: sandbox s1 did not wake within 100ms") {
			t.Fatalf("a connection past the wake timeout: %q", got)
		}
		if n := wakes(t, m, forward.WakeTimeout); n != 1 {
			t.Errorf("torpor_wakes_total{outcome=timeout} = %v, want 1", n)
		}
	})
}

// wakes is torpor_wakes_total{outcome} in m.
func wakes(t *testing.T, m *metrics.Set, outcome string) float64 {
	t.Helper()
	for _, mf := range gather(t, m, "torpor_wakes_total") {
		for _, l := range mf.GetLabel() {
			if l.GetName() == "outcome" && l.GetValue() == outcome {
				return mf.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// histogramCount is how many observations the histogram name in m holds.
func histogramCount(t *testing.T, m *metrics.Set, name string) uint64 {
	t.Helper()
	var n uint64
	for _, mf := range gather(t, m, name) {
		n += mf.GetHistogram().GetSampleCount()
	}
	return n
}

func gather(t *testing.T, m *metrics.Set, name string) []*dto.Metric {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()
		}
	}
	return nil
}
