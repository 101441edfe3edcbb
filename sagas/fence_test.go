package sagas_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
)

// lossyFence is a Config.Fence that refuses while lost; refused is closed
// once it refused three times.
type lossyFence struct {
	mu      sync.Mutex
	lost    bool
	asked   int
	refused chan struct{}
}

func newLossyFence(lost bool) *lossyFence {
	return &lossyFence{lost: lost, refused: make(chan struct{})}
}

func (f *lossyFence) check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.lost {
		return nil
	}
	if f.asked++; f.asked == 3 {
		close(f.refused)
	}
	return errors.New("lease lost")
}

func (f *lossyFence) set(lost bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost = lost
}

// waitRefused fails t unless the fence refused three times within wait.
func (f *lossyFence) waitRefused(t *testing.T) {
	t.Helper()
	select {
	case <-f.refused:
	case <-time.After(wait):
		t.Fatal("the fence was never asked")
	}
}

// TestFenceKeepsARunnerFromActing: while Config.Fence refuses (the runner
// lost its node's lease), the runner reads the log but calls no driver,
// records nothing and saves no position; once it allows, the intent is
// driven.
func TestFenceKeepsARunnerFromActing(t *testing.T) {
	fence := newLossyFence(true)
	h := newHarness(t, sagas.Config{Fence: fence.check})
	drv := newCounting(h.sim, "")
	h.run(drv)
	sb, created := h.create(node, nil)
	fence.waitRefused(t)
	if n := drv.total(); n != 0 {
		t.Errorf("%d driver calls behind a refusing fence, want 0", n)
	}
	if n := h.rec.callsOf(events.TypeStarted); n != 0 {
		t.Errorf("%d records behind a refusing fence, want 0", n)
	}
	if got := h.store.saved(); got != 0 {
		t.Errorf("position saved at %d behind a refusing fence, want none", got)
	}
	fence.set(false)
	sb.then(sb.outcome(created, 1), &events.Started{Generation: 1})
}
