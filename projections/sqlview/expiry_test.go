package sqlview

import (
	"context"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// TestExpirySameAsKV (issue 27): a sandbox's expiry policies (expires_at
// to the nanosecond, on_expiry, retain_for) and its held state's
// restore.expires_at read the same from the SQL view as from the KV view,
// while suspended and after the retention expired; a sandbox without
// them has none.
func TestExpirySameAsKV(t *testing.T) {
	d := newDB(t)
	a, b := newID(t), newID(t)
	script := []ev{
		{a, events.PhaseProvisioning, &events.Created{Name: "ea", Driver: "sim", Node: "n1", Generation: 1,
			ExpiresAt: time.Date(2027, 1, 2, 3, 4, 5, 123456789, time.UTC), OnExpiry: events.OnExpiryStop, RetainFor: "1m0s"}},
		{b, events.PhaseProvisioning, &events.Created{Name: "eb", Driver: "sim", Node: "n1", Generation: 1, RetainFor: "1h0m0s"}},
		{a, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{b, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{a, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{b, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{a, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "ra"}},
		{b, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "rb"}},
		{a, events.PhaseSuspended, &events.Expired{Policy: events.ExpiryRetention, ExpiresAt: t0.Add(time.Hour), Action: events.OnExpiryStop, RestoreRef: "ra"}},
		{a, events.PhaseStopped, &events.RetainedStateInvalidated{RestoreRef: "ra", Reason: events.ReasonExpired}},
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
		if id == a && (got.ExpiresAt.Nanosecond() != 123456789 || got.OnExpiry != events.OnExpiryStop || got.Reason != events.ReasonExpired) {
			t.Errorf("view of a: expires_at %s, on_expiry %q, reason %q", got.ExpiresAt, got.OnExpiry, got.Reason)
		}
		if id == b && (got.RetainFor != "1h0m0s" || got.Restore.ExpiresAt.IsZero()) {
			t.Errorf("view of b: retain_for %q, restore %+v; want 1h0m0s, held with expires_at", got.RetainFor, got.Restore)
		}
	}
}
