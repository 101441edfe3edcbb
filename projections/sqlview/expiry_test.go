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
// them has none. A ttl that pauses while suspended reads the same too:
// paused (c, suspended) and moved later by the stay (d, resumed).
func TestExpirySameAsKV(t *testing.T) {
	d := newDB(t)
	a, b, c, dd := newID(t), newID(t), newID(t), newID(t)
	pausing := func(name string) *events.Created {
		return &events.Created{Name: name, Driver: "sim", Node: "n1", Generation: 1,
			ExpiresAt: time.Date(2027, 1, 2, 3, 4, 5, 123456789, time.UTC), OnExpiry: events.OnExpiryDelete, TTLPausesWhileSuspended: true}
	}
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
		{c, events.PhaseProvisioning, pausing("ec")},
		{dd, events.PhaseProvisioning, pausing("ed")},
		{c, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{dd, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{c, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{dd, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{c, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "rc"}},
		{dd, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "rd"}},
		{dd, events.PhaseStarting, &events.ResumeRequested{Generation: 2, RestoreRef: "rd"}},
	}
	envs := envelopes(t, script)
	kv, sql, _ := bothViews(t, d, envs)
	ctx := context.Background()
	for _, id := range []string{a, b, c, dd} {
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
		if id == c && (!got.TTLPausesWhileSuspended || !got.ExpiryPaused) {
			t.Errorf("view of c: ttl_pauses_while_suspended %v, expiry_paused %v; want both", got.TTLPausesWhileSuspended, got.ExpiryPaused)
		}
		if moved := pausing("").ExpiresAt.Add(time.Second + 1234567); id == dd && (!got.ExpiresAt.Equal(moved) || got.ExpiryPaused) {
			// suspended at event 17, resumed at 18: envelopes are 1.001234567s apart
			t.Errorf("view of d: expires_at %s, paused %v; want %s, not paused", got.ExpiresAt, got.ExpiryPaused, moved)
		}
	}
}
