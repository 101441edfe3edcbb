package sqlview

import (
	"context"
	"testing"

	"github.com/torpor/torpor/events"
)

// TestIdleSameAsKV (issue 27): a sandbox's idle policy reads the same from
// the SQL view as from the KV view, through an idle timeout and its
// suspension; a sandbox without one has none.
func TestIdleSameAsKV(t *testing.T) {
	d := newDB(t)
	a, b := newID(t), newID(t)
	p := events.IdlePolicy{After: "5m0s", Action: events.IdleSuspend, Fallback: events.IdleFallbackStop}
	script := []ev{
		{a, events.PhaseProvisioning, &events.Created{Name: "ia", Driver: "sim", Node: "n1", Generation: 1, Idle: p}},
		{b, events.PhaseProvisioning, &events.Created{Name: "ib", Driver: "sim", Node: "n1", Generation: 1}},
		{a, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{b, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{a, events.PhaseReady, &events.IdleTimeout{Policy: p, LastActiveAt: t0, Action: events.IdleSuspend}},
		{a, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{a, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "ra"}},
	}
	envs := envelopes(t, script)
	kv, sql, _ := bothViews(t, d, envs)
	ctx := context.Background()
	for _, id := range []string{a, b} {
		want, err := kv.Get(ctx, id)
		if err != nil {
			t.Fatalf("kv Get %s: %v", id, err)
		}
		got, err := sql.Get(ctx, id)
		if err != nil {
			t.Fatalf("sql Get %s: %v", id, err)
		}
		sameJSON(t, "view "+id, got, want)
		if id == a && (got.Idle != p || got.Phase != events.PhaseSuspended) {
			t.Errorf("view of a: idle %+v, %s; want %+v, suspended", got.Idle, got.Phase, p)
		}
		if id == b && !got.Idle.None() {
			t.Errorf("view of b: idle %+v, want none", got.Idle)
		}
	}
}
