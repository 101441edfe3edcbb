package kvview

import (
	"context"
	"errors"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/memstore"
	"github.com/torpor/torpor/events/natstest"
)

// TestGarbageInTheBucket (issue 23, attack 6): values in torpor_phases that
// are no view (not JSON, another sandbox's view, no phase) are passed over
// by List and Counts and counted; a Get of one is UNAVAILABLE, not a
// failure of the whole view; the next event of such a sandbox rebuilds
// its view from the log, and the other sandboxes' events apply all along.
func TestGarbageInTheBucket(t *testing.T) {
	js := natstest.Start(t).JS
	ctx := context.Background()
	log := memstore.New()
	v, err := New(ctx, js, Config{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{newID(t), newID(t), newID(t), newID(t)}
	heads := map[string]uint64{}
	add := func(id string, phase events.Phase, e events.Event) events.Envelope {
		t.Helper()
		en := env(t, id, 0, phase, e)
		seq, err := log.Append(ctx, id, heads[id], en)
		if err != nil {
			t.Fatal(err)
		}
		heads[id], en.Seq = seq, seq
		apply(t, v, en)
		return en
	}
	for _, id := range ids {
		add(id, events.PhaseProvisioning, created(id, nil))
		add(id, events.PhaseReady, &events.SupervisorAttached{Generation: 1})
	}
	garbage := map[string]string{
		ids[0]: `not json`,
		ids[1]: `{"id":"` + ids[3] + `","phase":"ready","seq":2}`,
		ids[2]: `{"id":"` + ids[2] + `","seq":7}`,
	}
	for id, g := range garbage {
		if _, err := v.kv.Put(ctx, id, []byte(g)); err != nil {
			t.Fatal(err)
		}
	}
	v.mu.Lock()
	clear(v.cache) // a restarted writer: it reads the bucket
	v.mu.Unlock()

	page, err := v.List(ctx, Query{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(page.Items) != 1 || page.Items[0].ID != ids[3] {
		t.Errorf("List = %v, want only %s", page.Items, ids[3])
	}
	counts, err := v.Counts(ctx)
	if err != nil {
		t.Fatalf("Counts: %v", err)
	}
	if counts[events.PhaseReady] != 1 {
		t.Errorf("Counts = %v, want one ready", counts)
	}
	if _, err := v.Get(ctx, ids[0]); !errors.Is(err, ErrGarbage) || events.CodeOf(err) != events.CodeUnavailable {
		t.Errorf("Get of garbage: %v, want UNAVAILABLE", err)
	}
	if v.Garbage() == 0 {
		t.Error("the garbage was not counted")
	}

	// The next event of each: its view is rebuilt from the log.
	for _, id := range ids {
		add(id, events.PhaseStopping, &events.StopRequested{Generation: 1})
		got := get(t, v, id)
		if got.ID != id || got.Phase != events.PhaseStopping || got.Name == "" || got.Seq != heads[id] {
			t.Errorf("view of %s after its next event: %+v, want stopping at %d", id, got, heads[id])
		}
	}
}

// TestCheckpointGarbage (issue 23, attack 7): a checkpoint that holds no
// sequence does not stop the view from starting: it applies the log again
// from its start (idempotently) and the next checkpoint overwrites it.
func TestCheckpointGarbage(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	v := newView(t, srv.JS)
	log := randomLog(t, 5, 10, 50)
	applyBatch(t, v, log...)
	kv, err := srv.JS.KeyValue(ctx, "torpor_positions")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "kvview.torpor_phases", []byte("-1 garbage")); err != nil {
		t.Fatal(err)
	}
	w, err := New(ctx, srv.JS, Config{})
	if err != nil {
		t.Fatalf("New over a garbage checkpoint: %v", err)
	}
	checkpointIs(t, w, 0)
	applyBatch(t, w, log...)
	checkpointIs(t, w, uint64(len(log)))
	if got := position(t, srv.JS, "kvview.torpor_phases"); got != "50" {
		t.Errorf("checkpoint key %q, want 50", got)
	}
}
