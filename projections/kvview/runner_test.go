package kvview

import (
	"context"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections"
)

// replay is a fake projections.Source: it hands its events above after to
// the handler, in batches of up to max, then waits for ctx to end.
type replay []events.Envelope

func (r replay) Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error {
	rest := r
	for len(rest) > 0 && rest[0].Seq <= after {
		rest = rest[1:]
	}
	for len(rest) > 0 {
		n := min(len(rest), max)
		if err := h(ctx, rest[:n:n], uint64(len(rest)-n)); err != nil {
			return err
		}
		rest = rest[n:]
	}
	<-ctx.Done()
	return nil
}

func TestRunnerFeedsView(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	src := replay{
		env(t, id, 1, events.PhaseProvisioning, created(id, nil)),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
	}
	r, err := projections.NewRunner(src, v, projections.Config{})
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	got, err := v.Wait(wctx, id, events.PhaseReady, 0)
	if err != nil || got.Seq != 2 {
		t.Errorf("Wait = %+v, %v; want ready at seq 2", got, err)
	}
}
