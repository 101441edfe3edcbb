package sqlview

import (
	"context"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections"
	"github.com/torpor/torpor/projections/kvview"
)

// TestWakeOnTrafficSameAsKV (issue 27): create's wake_on_traffic reads the
// same from the SQL view as from the KV view, through a rebuild's copy
// and the live upserts alike; a sandbox created without it has it false.
func TestWakeOnTrafficSameAsKV(t *testing.T) {
	d := newDB(t)
	a, b := newID(t), newID(t)
	script := []ev{
		{a, events.PhaseProvisioning, &events.Created{Name: "wa", Driver: "sim", Node: "n1", Generation: 1, WakeOnTraffic: true}},
		{b, events.PhaseProvisioning, &events.Created{Name: "wb", Driver: "sim", Node: "n1", Generation: 1}},
		{a, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{a, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{a, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "ra"}},
	}
	envs := envelopes(t, script)
	ns := natstest.Start(t)
	store := logOf(t, envs)
	last := envs[len(envs)-1].Seq
	kv, err := kvview.New(context.Background(), ns.JS, kvview.Config{})
	if err != nil {
		t.Fatalf("kvview: %v", err)
	}
	sql := d.view(t, DefaultName, nil)
	for _, p := range []projections.Projection{kv, sql} {
		r, err := projections.NewRunner(store, p, projections.Config{BatchSize: 64})
		if err != nil {
			t.Fatalf("runner: %v", err)
		}
		run(t, r)
	}
	caughtUp(t, sql, last)
	eventually(t, "kvview at the head", func() (bool, error) {
		cp, err := kv.Checkpoint(context.Background())
		return cp >= last, err
	})
	ctx := context.Background()
	for id, want := range map[string]bool{a: true, b: false} {
		kvv, err := kv.Get(ctx, id)
		if err != nil {
			t.Fatalf("kv Get %s: %v", id, err)
		}
		got, err := sql.Get(ctx, id)
		if err != nil {
			t.Fatalf("sql Get %s: %v", id, err)
		}
		sameJSON(t, "view "+id, got, kvv)
		if got.WakeOnTraffic != want {
			t.Errorf("view %s: wake_on_traffic %v, want %v", id, got.WakeOnTraffic, want)
		}
	}
}
