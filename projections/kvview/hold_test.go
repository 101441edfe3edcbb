package kvview

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
)

func holdView(t *testing.T, hold time.Duration) *View {
	t.Helper()
	v, err := New(context.Background(), natstest.Start(t).JS, Config{HoldTransient: hold})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

// TestHoldWritesAnOutcomeOnce: a transient phase is held back, and when its
// outcome follows, one write stores both; the checkpoint never passes a held
// event.
func TestHoldWritesAnOutcomeOnce(t *testing.T) {
	v := holdView(t, time.Hour)
	id := newID(t)
	applyBatch(t, v, env(t, id, 1, events.PhaseProvisioning, created(id, nil)),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	checkpointIs(t, v, 2)
	before := streamLast(t, v)

	applyBatch(t, v, env(t, id, 3, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}))
	if got := get(t, v, id); got.Phase != events.PhaseReady || got.Seq != 2 {
		t.Errorf("view while suspending is held: %s at %d, want ready at 2", got.Phase, got.Seq)
	}
	if got := streamLast(t, v) - before; got != 0 {
		t.Errorf("%d writes for a held transient phase, want none", got)
	}
	checkpointIs(t, v, 2)

	applyBatch(t, v, env(t, id, 4, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "r1"}))
	got := get(t, v, id)
	if got.Phase != events.PhaseSuspended || got.Seq != 4 || !got.Restore.Held {
		t.Errorf("view after the outcome: %+v, want suspended at 4 holding a reference", got)
	}
	// One view write for both.
	if n := streamLast(t, v) - before; n != 1 {
		t.Errorf("%d writes for suspend_requested + suspended, want 1", n)
	}
	checkpointIs(t, v, 4)
}

// TestHoldIsUpWritesTheTransientPhase: with no outcome in time, the timer
// writes the transient phase on its own.
func TestHoldIsUpWritesTheTransientPhase(t *testing.T) {
	v := holdView(t, 20*time.Millisecond)
	id := newID(t)
	applyBatch(t, v, env(t, id, 1, events.PhaseProvisioning, created(id, nil)),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	held := time.Now()
	applyBatch(t, v, env(t, id, 3, events.PhaseStopping, &events.StopRequested{Generation: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := v.Wait(ctx, id, events.PhaseStopping, 2)
	if err != nil {
		t.Fatalf("wait for stopping: %v", err)
	}
	if got.Seq != 3 {
		t.Errorf("view seq %d, want 3", got.Seq)
	}
	if waited := time.Since(held); waited < 20*time.Millisecond {
		t.Errorf("stopping written after %s, before its hold of 20ms was up", waited)
	}
}

// TestHoldFlushWritesEverything: Flush (the runner stopping) writes what is
// held, then a checkpoint covering it; a settled phase is never held.
func TestHoldFlushWritesEverything(t *testing.T) {
	v := holdView(t, time.Hour)
	a, b := newID(t), newID(t)
	applyBatch(t, v,
		env(t, a, 1, events.PhaseProvisioning, created(a, nil)),
		env(t, b, 2, events.PhaseProvisioning, created(b, nil)),
		env(t, b, 3, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	if _, err := v.Get(context.Background(), a); err == nil {
		t.Error("a provisioning sandbox was written before its hold was up")
	}
	if got := get(t, v, b); got.Phase != events.PhaseReady {
		t.Errorf("b is %s, want ready written at once", got.Phase)
	}
	checkpointIs(t, v, 0)
	if err := v.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := get(t, v, a); got.Phase != events.PhaseProvisioning || got.Seq != 1 {
		t.Errorf("a after Flush: %s at %d, want provisioning at 1", got.Phase, got.Seq)
	}
	checkpointIs(t, v, 3)
}

// TestHoldEndsLikeNoHold: whatever the hold keeps back on the way, once it
// is flushed the bucket equals the one written without a hold.
func TestHoldEndsLikeNoHold(t *testing.T) {
	js := natstest.Start(t).JS
	plain := newBucket(t, js, "plain")
	held, err := New(context.Background(), js, Config{Bucket: "held", HoldTransient: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	log := randomLog(t, 7, 60, 2000)
	r := rand.New(rand.NewPCG(7, 7))
	for rest := log; len(rest) > 0; {
		n := min(len(rest), 1+r.IntN(40))
		applyBatch(t, plain, rest[:n]...)
		applyBatch(t, held, rest[:n]...)
		rest = rest[n:]
	}
	if plainWrites, heldWrites := streamLast(t, plain), streamLast(t, held); heldWrites >= plainWrites {
		t.Errorf("held bucket took %d writes, plain %d: the hold saved nothing", heldWrites, plainWrites)
	}
	if err := held.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	sameBucket(t, plain, held)
	checkpointIs(t, held, uint64(len(log)))
}
