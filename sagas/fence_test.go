package sagas_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
)

// TestFenceKeepsARunnerFromActing: while Config.Fence refuses (the runner
// lost its node's lease), the runner reads the log but calls no driver,
// records nothing and saves no position; once it allows, the intent is
// driven.
func TestFenceKeepsARunnerFromActing(t *testing.T) {
	var (
		mu    sync.Mutex
		lost  = true
		asked int
	)
	refused := make(chan struct{}) // closed once the fence refused three times
	fence := func() error {
		mu.Lock()
		defer mu.Unlock()
		if !lost {
			return nil
		}
		if asked++; asked == 3 {
			close(refused)
		}
		return errors.New("lease lost")
	}
	h := newHarness(t, sagas.Config{Fence: fence})
	drv := newCounting(h.sim, "")
	h.run(drv)
	sb, created := h.create(node, nil)
	select {
	case <-refused:
	case <-time.After(wait):
		t.Fatal("the fence was never asked")
	}
	if n := drv.total(); n != 0 {
		t.Errorf("%d driver calls behind a refusing fence, want 0", n)
	}
	if n := h.rec.callsOf(events.TypeStarted); n != 0 {
		t.Errorf("%d records behind a refusing fence, want 0", n)
	}
	if got := h.store.saved(); got != 0 {
		t.Errorf("position saved at %d behind a refusing fence, want none", got)
	}
	mu.Lock()
	lost = false
	mu.Unlock()
	sb.then(sb.outcome(created, 1), &events.Started{Generation: 1})
}
