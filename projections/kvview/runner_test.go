package kvview

import (
	"context"
	"encoding/json"
	"strings"
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
	runUntilCleanup(t, r)

	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	got, err := v.Wait(wctx, id, events.PhaseReady, 0)
	if err != nil || got.Seq != 2 {
		t.Errorf("Wait = %+v, %v; want ready at seq 2", got, err)
	}
}

var _ projections.Parker = (*View)(nil)

// TestRunnerParksWhatTheViewCannotApply: an event whose sandbox id cannot
// be a key of the view (a publisher other than torpor may write such a
// subject) is parked, recorded in torpor_parked with its seq and error,
// and counted; the events around it are applied and the view moves past it.
func TestRunnerParksWhatTheViewCannotApply(t *testing.T) {
	srv := natstest.Start(t)
	v := newView(t, srv.JS)
	id := newID(t)
	src := replay{
		env(t, id, 1, events.PhaseProvisioning, created(id, nil)),
		env(t, "a@b", 2, events.PhaseProvisioning, created("sandbox-a@b", nil)),
		env(t, id, 3, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
	}
	r, err := projections.NewRunner(src, v, projections.Config{Attempts: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, r)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if got, err := v.Wait(wctx, id, events.PhaseReady, 0); err != nil || got.Seq != 3 {
		t.Fatalf("Wait = %+v, %v; want ready at seq 3, past the parked event", got, err)
	}
	if n := r.Parked(); n != 1 {
		t.Fatalf("parked %d, want 1", n)
	}
	kv, err := srv.JS.KeyValue(wctx, ParkedBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(wctx, "kvview.2")
	if err != nil {
		t.Fatal(err)
	}
	var p Parked
	if err := json.Unmarshal(e.Value(), &p); err != nil || p.Seq != 2 || p.SandboxID != "a@b" || p.Type != events.TypeCreated || !strings.Contains(p.Error, "cannot be a key") {
		t.Fatalf("parked record %+v (%v) from %s", p, err, e.Value())
	}
}

// runUntilCleanup runs r until t's cleanup, which fails t if Run ended with
// an error, and returns the context it runs under.
func runUntilCleanup(t *testing.T, r *projections.Runner) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ctx
}
