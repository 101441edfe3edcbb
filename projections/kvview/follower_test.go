package kvview

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
)

type followed struct {
	view events.View
	err  error
}

// waitAsync runs f.Wait in a goroutine; the channel gets its answer.
func followWait(ctx context.Context, f *Follower, id string, phase events.Phase, after uint64) <-chan followed {
	ch := make(chan followed, 1)
	go func() {
		v, err := f.Wait(ctx, id, phase, after)
		ch <- followed{v, err}
	}()
	return ch
}

func answer(t *testing.T, ch <-chan followed) followed {
	t.Helper()
	select {
	case w := <-ch:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not return")
	}
	return followed{}
}

// consumers is how many consumers the bucket's stream has on the server.
func consumers(t *testing.T, js jetstream.JetStream, bucket string) int {
	t.Helper()
	s, err := js.Stream(context.Background(), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// TestFollowerWaits: the follower's waits answer as View.Wait's do — a
// phase reached later, a phase held already, a sandbox not projected yet,
// a view at or below after left out, a terminal phase FAILED_PRECONDITION,
// the end of ctx with the last view seen.
func TestFollowerWaits(t *testing.T) {
	srv := natstest.Start(t)
	v := newView(t, srv.JS)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := v.Follow(ctx)

	id := newID(t)
	notYet := followWait(ctx, f, id, events.PhaseReady, 0)
	time.Sleep(50 * time.Millisecond) // the wait is registered before the sandbox exists
	applyBatch(t, v, env(t, id, 1, events.PhaseProvisioning, created(id, nil)))
	applyBatch(t, v, env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	if w := answer(t, notYet); w.err != nil || w.view.Seq != 2 || w.view.Phase != events.PhaseReady {
		t.Fatalf("wait for a sandbox not projected yet: %+v", w)
	}
	if w := answer(t, followWait(ctx, f, id, events.PhaseReady, 0)); w.err != nil || w.view.Seq != 2 {
		t.Fatalf("wait for the phase held already: %+v", w)
	}
	later := followWait(ctx, f, id, events.PhaseReady, 2)
	applyBatch(t, v, env(t, id, 3, events.PhaseStopping, &events.StopRequested{Generation: 1}))
	applyBatch(t, v, env(t, id, 4, events.PhaseStopped, &events.Stopped{Generation: 1}))
	applyBatch(t, v, env(t, id, 5, events.PhaseStarting, &events.StartRequested{Generation: 2}))
	applyBatch(t, v, env(t, id, 6, events.PhaseReady, &events.SupervisorAttached{Generation: 2}))
	if w := answer(t, later); w.err != nil || w.view.Seq != 6 {
		t.Fatalf("wait after seq 2: %+v, want ready at 6", w)
	}
	never := followWait(ctx, f, id, events.PhaseSuspended, 6)
	applyBatch(t, v, env(t, id, 7, events.PhaseDeleting, &events.DeleteRequested{}))
	applyBatch(t, v, env(t, id, 8, events.PhaseDeleted, &events.Deleted{}))
	if w := answer(t, never); events.CodeOf(w.err) != events.CodeFailedPrecondition || w.view.Phase != events.PhaseDeleted {
		t.Fatalf("wait for a phase a deleted sandbox never reaches: %+v", w)
	}
	tctx, tcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer tcancel()
	if w := answer(t, followWait(tctx, f, id, events.PhaseReady, 8)); !errors.Is(w.err, context.DeadlineExceeded) || w.view.Seq != 8 {
		t.Fatalf("a wait whose ctx ends: %+v, want the last view and DeadlineExceeded", w)
	}
	if _, err := f.Wait(ctx, "no.view", events.PhaseReady, 0); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("an id that is no view: %v, want ErrNotFound", err)
	}
}

// TestFollowerOneConsumer: many waits at once hold one consumer on the
// server (the follower's), where View.Wait holds one per wait; all of them
// answer once the sandbox is ready.
func TestFollowerOneConsumer(t *testing.T) {
	srv := natstest.Start(t)
	v := newView(t, srv.JS)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := v.Follow(ctx)
	id := newID(t)
	applyBatch(t, v, env(t, id, 1, events.PhaseProvisioning, created(id, nil)))
	base := consumers(t, srv.JS, "torpor_phases")

	const n = 40
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second) // a wait that never answers fails, not hangs
	defer wcancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for range n {
		wg.Go(func() {
			if w, err := f.Wait(wctx, id, events.PhaseReady, 0); err != nil || w.Seq != 2 {
				errs <- err
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // every wait is in place
	if got := consumers(t, srv.JS, "torpor_phases"); got != base {
		t.Errorf("%d waits of the follower: %d consumers, want %d (the follower's own)", n, got, base)
	}
	// The contrast: View.Wait holds a consumer of its own per wait.
	for range n {
		wg.Go(func() {
			if w, err := v.Wait(wctx, id, events.PhaseReady, 0); err != nil || w.Seq != 2 {
				errs <- err
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	if got := consumers(t, srv.JS, "torpor_phases"); got < base+n {
		t.Errorf("%d waits of View.Wait: %d consumers, want at least %d", n, got, base+n)
	}
	applyBatch(t, v, env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a wait: %v", err)
	}
}
