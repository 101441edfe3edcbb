package kvview

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/events/storetest"
	"github.com/torpor/torpor/projections"
)

// TestForgedEventsParked: well-formed events the lifecycle table refuses
// (suspended, deleted, exited on a stopped sandbox, a bogus stamped phase,
// data that is not an object) change no view, whatever phase they are
// stamped with; the runner parks each in torpor_parked and counts it, and
// the next real event still applies.
func TestForgedEventsParked(t *testing.T) {
	srv := natstest.Start(t)
	v := newView(t, srv.JS)
	id := newID(t)
	log := replay{
		env(t, id, 1, events.PhaseProvisioning, created(id, nil)),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
		env(t, id, 3, events.PhaseStopping, &events.StopRequested{Generation: 1}),
		env(t, id, 4, events.PhaseStopped, &events.Stopped{Generation: 1}),
	}
	forged := storetest.Forged(id, 1, t0)
	for i := range forged {
		forged[i].Seq = uint64(5 + i)
	}
	log = append(log, forged...)
	last := env(t, id, uint64(5+len(forged)), events.PhaseStarting, &events.StartRequested{Generation: 2})
	log = append(log, last)

	r, err := projections.NewRunner(log, v, projections.Config{BatchSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runUntilCleanup(t, r)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	got, err := v.Wait(wctx, id, events.PhaseStarting, 0)
	if err != nil {
		t.Fatalf("Wait starting: %v (view %+v)", err, got)
	}
	if got.Seq != last.Seq || got.Generation != 2 || got.ExitCode != nil || got.Restore.Held {
		t.Errorf("view %+v: want starting at seq %d, generation 2, no exit code, nothing held", got, last.Seq)
	}
	if n := r.Parked(); n != uint64(len(forged)) {
		t.Errorf("Parked = %d, want %d", n, len(forged))
	}
	kv, err := srv.JS.KeyValue(context.Background(), ParkedBucket)
	if err != nil {
		t.Fatalf("parked bucket: %v", err)
	}
	keys, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	if n != len(forged) {
		t.Errorf("%s holds %d keys, want %d", ParkedBucket, n, len(forged))
	}
}

// TestForgedEventsChangeNoView: each forged event applied alone is
// unapplicable and leaves the stopped view as it was.
func TestForgedEventsChangeNoView(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	apply(t, v,
		env(t, id, 1, events.PhaseProvisioning, created(id, nil)),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
		env(t, id, 3, events.PhaseStopping, &events.StopRequested{Generation: 1}),
		env(t, id, 4, events.PhaseStopped, &events.Stopped{Generation: 1}))
	want := get(t, v, id)
	for i, f := range storetest.Forged(id, 1, t0) {
		f.Seq = uint64(5 + i)
		if err := v.Apply(context.Background(), f); !errors.Is(err, projections.ErrUnapplicable) {
			t.Errorf("apply forged %s (stamped %q): %v, want ErrUnapplicable", f.Type, f.Phase, err)
		}
		sameView(t, get(t, v, id), want)
	}
}
