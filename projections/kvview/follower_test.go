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
	// The base is the follower's own consumer, once its watch is up: a CI
	// run counted it before it was (base 0), then the waits "held" it.
	select {
	case <-f.up:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower never came up")
	}
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

// next is the next view ch delivers; it fails the test after 10 s.
func next(t *testing.T, ch <-chan events.View) events.View {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatal("the watch ended")
		}
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("the watch delivered nothing")
	}
	return events.View{}
}

// TestFollowerWatch: the follower's watches start with the current views
// (read once from the bucket, by a consumer stopped at their end), then get
// every change from the follower's own watch; one resumed with the seq of a
// change the follower holds is replayed from memory, holding no consumer;
// one resumed from a seq it does not hold starts from the bucket, above
// that seq; one that falls too far behind is ended.
func TestFollowerWatch(t *testing.T) {
	srv := natstest.Start(t)
	v := newView(t, srv.JS)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a, b := newID(t), newID(t)
	applyBatch(t, v, env(t, a, 1, events.PhaseProvisioning, created(a, nil)))
	applyBatch(t, v, env(t, b, 2, events.PhaseProvisioning, created(b, nil)))
	f := v.Follow(ctx)
	select {
	case <-f.up: // a watch from before would be ended as the follower comes up
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not come up")
	}
	base := consumers(t, srv.JS, "torpor_phases") // the follower's own

	fresh, err := f.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for range 2 {
		w := next(t, fresh)
		got[w.ID] = w.Seq
	}
	if got[a] != 1 || got[b] != 2 {
		t.Fatalf("a fresh watch's start: %v, want %s at 1 and %s at 2", got, a, b)
	}
	applyBatch(t, v, env(t, a, 3, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	applyBatch(t, v, env(t, b, 4, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	if w := next(t, fresh); w.ID != a || w.Seq != 3 {
		t.Fatalf("first change: %s at %d, want %s at 3", w.ID, w.Seq, a)
	}
	if w := next(t, fresh); w.ID != b || w.Seq != 4 {
		t.Fatalf("second change: %s at %d, want %s at 4", w.ID, w.Seq, b)
	}
	if n := consumers(t, srv.JS, "torpor_phases"); n != base {
		t.Errorf("a watch past its start: %d consumers, want %d (the follower's)", n, base)
	}

	// Resumed after the change at 3, which the follower holds: b at 4 from
	// memory, then the changes to come, and no consumer at any point.
	resumed, err := f.Watch(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if n := consumers(t, srv.JS, "torpor_phases"); n != base {
		t.Errorf("a watch resumed from memory: %d consumers, want %d", n, base)
	}
	if w := next(t, resumed); w.ID != b || w.Seq != 4 {
		t.Fatalf("resumed after 3: %s at %d, want %s at 4", w.ID, w.Seq, b)
	}
	applyBatch(t, v, env(t, a, 5, events.PhaseStopping, &events.StopRequested{Generation: 1}))
	if w := next(t, resumed); w.ID != a || w.Seq != 5 {
		t.Fatalf("resumed, then: %s at %d, want %s at 5", w.ID, w.Seq, a)
	}

	// Resumed after 1, which the follower never saw: the current views
	// above 1, from the bucket.
	old, err := f.Watch(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	got = map[string]uint64{}
	for range 2 {
		w := next(t, old)
		got[w.ID] = w.Seq
	}
	if got[a] != 5 || got[b] != 4 {
		t.Fatalf("resumed after a seq not held: %v, want %s at 5 and %s at 4", got, a, b)
	}

	// A watch nobody reads is ended once it is subQueue changes behind.
	slow, err := f.Watch(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(6)
	for range subQueue/256 + 2 {
		batch := make([]events.Envelope, 0, 256)
		for range 256 { // a view per sandbox and batch: one change each
			id := newID(t)
			batch = append(batch, env(t, id, seq, events.PhaseProvisioning, created(id, nil)))
			seq++
		}
		applyBatch(t, v, batch...)
	}
	read, deadline := 0, time.After(20*time.Second)
	for ended := false; !ended; {
		select {
		case _, ok := <-slow:
			ended = !ok
			read++
		case <-deadline:
			t.Fatalf("a watch %d changes behind is still open (%d read)", seq-6, read)
		}
	}
	if read > subQueue+128 {
		t.Errorf("the slow watch delivered %d views before it ended, want about %d at most", read, subQueue)
	}
	// What the follower keeps is bounded by its ring, whatever the fleet:
	// the 4608 sandboxes just created are more than it holds, and a, whose
	// last change is older than all of theirs, is no longer held.
	f.mu.Lock()
	held := len(f.latest)
	_, aHeld := f.latest[a]
	f.mu.Unlock()
	if held > ringSize || aHeld {
		t.Errorf("the follower holds the latest values of %d keys (a among them: %v), want at most %d, a not", held, aHeld, ringSize)
	}
	// The others were read and are still open.
	if w := next(t, fresh); w.ID != a || w.Seq != 5 {
		t.Fatalf("the fresh watch after the slow one: %s at %d", w.ID, w.Seq)
	}
}

// TestSettle: Settle, of the view and of its follower, answers the first
// view above after whose phase is not transient — the outcome of the
// command answered at after+1, passing over the transient phase on the way
// (stopping), a terminal phase with no error (deleted), a sandbox not
// projected yet waited for — and when ctx ends the last view seen.
func TestSettle(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, tc := range []struct {
		name   string
		settle func(*View) func(context.Context, string, uint64) (events.View, error)
	}{
		{"view", func(v *View) func(context.Context, string, uint64) (events.View, error) { return v.Settle }},
		{"follower", func(v *View) func(context.Context, string, uint64) (events.View, error) { return v.Follow(ctx).Settle }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newView(t, srv.JS)
			settle := tc.settle(v)
			async := func(ctx context.Context, id string, after uint64) <-chan followed {
				ch := make(chan followed, 1)
				go func() {
					view, err := settle(ctx, id, after)
					ch <- followed{view, err}
				}()
				return ch
			}
			id := newID(t)
			made := async(ctx, id, 0)
			applyBatch(t, v, env(t, id, 1, events.PhaseProvisioning, created(id, nil)))
			applyBatch(t, v, env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
			if w := answer(t, made); w.err != nil || w.view.Seq != 2 || w.view.Phase != events.PhaseReady {
				t.Fatalf("settle of a create: %+v, want ready at 2", w)
			}
			stop := async(ctx, id, 2)
			applyBatch(t, v, env(t, id, 3, events.PhaseStopping, &events.StopRequested{Generation: 1}))
			applyBatch(t, v, env(t, id, 4, events.PhaseStopped, &events.Stopped{Generation: 1}))
			if w := answer(t, stop); w.err != nil || w.view.Seq != 4 || w.view.Phase != events.PhaseStopped {
				t.Fatalf("settle of a stop: %+v, want stopped at 4", w)
			}
			if w := answer(t, async(ctx, id, 3)); w.err != nil || w.view.Seq != 4 {
				t.Fatalf("settle of what is settled already: %+v, want stopped at 4", w)
			}
			del := async(ctx, id, 4)
			applyBatch(t, v, env(t, id, 5, events.PhaseDeleting, &events.DeleteRequested{}))
			applyBatch(t, v, env(t, id, 6, events.PhaseDeleted, &events.Deleted{}))
			if w := answer(t, del); w.err != nil || w.view.Seq != 6 || w.view.Phase != events.PhaseDeleted {
				t.Fatalf("settle of a delete: %+v, want deleted at 6", w)
			}
			tctx, tcancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer tcancel()
			if w := answer(t, async(tctx, id, 6)); !errors.Is(w.err, context.DeadlineExceeded) || w.view.Seq != 6 {
				t.Fatalf("a settle whose ctx ends: %+v, want the last view and DeadlineExceeded", w)
			}
		})
	}
}
