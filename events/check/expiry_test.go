package check_test

import (
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
)

// Issue 27: a retention that expired stops the suspended sandbox, its
// reference invalidated in the same append.
var (
	createdRetain = step{&events.Created{Name: "a", Driver: "sim", Generation: 1, RetainFor: "1s"}, "provisioning", "c1"}
	retentionEnd  = step{&events.Expired{Policy: events.ExpiryRetention, ExpiresAt: t0.Add(4 * time.Second), Action: events.OnExpiryStop, RestoreRef: "r1"}, "suspended", "c2"}
	invalidExp    = step{&events.RetainedStateInvalidated{RestoreRef: "r1", Reason: events.ReasonExpired}, "stopped", "c2"}
)

// TestRetentionExpiredIsClean: the expiry's path has no violation, and the
// views end stopped with reason Expired, no state held.
func TestRetentionExpiredIsClean(t *testing.T) {
	log := build(t, createdRetain, attached1, suspend1, suspended, retentionEnd, invalidExp,
		step{&events.StartRequested{Generation: 2}, "starting", "c3"},
		step{&events.Started{Generation: 2}, "starting", "c3"},
		step{&events.SupervisorAttached{Generation: 2}, "ready", ""})
	if vs := check.Log(log[:6], check.Options{}); len(vs) != 0 {
		t.Fatalf("violations %v; want none", vs)
	}
	var v events.View
	for _, env := range log[:6] {
		v.Fold(env)
	}
	if v.Phase != events.PhaseStopped || v.Reason != events.ReasonExpired || v.Restore.Held {
		t.Fatalf("view after the expiry: phase %s, reason %q, held %v; want stopped, Expired, not held", v.Phase, v.Reason, v.Restore.Held)
	}
	if vs := check.Log(log, check.Options{}); len(vs) != 0 {
		t.Fatalf("a cold start after the expiry: violations %v; want none", vs)
	}
}

// TestRetentionExpiredStillProvesInvariant1: after an expiry invalidated
// r1, a log that brings the sandbox back to suspended on it (a restore
// failure "before the consumption" after a cold start, which the views'
// table takes) breaks invariant 1, and an invalidation in suspended that
// no expiry made is reported against CONTRACT §1.
func TestRetentionExpiredStillProvesInvariant1(t *testing.T) {
	log := build(t, createdRetain, attached1, suspend1, suspended, retentionEnd, invalidExp,
		step{&events.StartRequested{Generation: 2}, "starting", "c3"},
		step{&events.ResumeFailed{Generation: 2}, "suspended", "c3"})
	vs := check.Log(log, check.Options{})
	found := false
	for _, v := range vs {
		found = found || (v.Invariant == check.RetainedStateOnce && v.Seq == 8 && strings.Contains(v.Message, `"r1"`))
	}
	if !found {
		t.Fatalf("violations %v; want invariant 1 at seq 8 on r1", vs)
	}

	bare := build(t, createdRetain, attached1, suspend1, suspended,
		step{&events.RetainedStateInvalidated{RestoreRef: "r1"}, "stopped", "c2"})
	vs = check.Log(bare, check.Options{})
	if len(vs) != 1 || vs[0].Seq != 5 || vs[0].Rule != check.RuleTable {
		t.Fatalf("an invalidation in suspended with no expiry: violations %v; want one of rule table at seq 5", vs)
	}
}

// TestTTLPausedWhileSuspended (issue 27, item 5's last clause): with
// ttl_pauses_while_suspended the ttl moves later by each stay in
// suspended (events a second apart: suspended at 3, resumed at 4, so 1s),
// and an expiry at the moved time, recorded no earlier, is clean; one at
// created's time, one while suspended, and one recorded before its time
// are rule expiry's.
func TestTTLPausedWhileSuspended(t *testing.T) {
	withTTL := func(at time.Duration, pauses bool) step {
		return step{&events.Created{Name: "a", Driver: "sim", Generation: 1, ExpiresAt: t0.Add(at), OnExpiry: events.OnExpiryDelete, TTLPausesWhileSuspended: pauses}, "provisioning", "c1"}
	}
	ttl := func(at time.Duration) step {
		return step{&events.Expired{Policy: events.ExpiryTTL, ExpiresAt: t0.Add(at), Action: events.OnExpiryDelete}, "", "c9"}
	}
	deleting := step{&events.DeleteRequested{}, "deleting", "c9"}
	resumedThen := func(at time.Duration) []step {
		return []step{withTTL(5*time.Second, true), attached1, suspend1, suspended, resume2, consumed2, resumed2, attached2, ttl(at), deleting}
	}
	cases := []struct {
		name  string
		steps []step
		seq   uint64 // of the violation; 0 for none
	}{
		{"at the moved time", resumedThen(6 * time.Second), 0},
		{"at created's time", resumedThen(5 * time.Second), 9},
		{"while suspended", []step{withTTL(2*time.Second, true), attached1, suspend1, suspended, ttl(2 * time.Second), deleting}, 5},
		{"without the option, while suspended", []step{withTTL(2*time.Second, false), attached1, suspend1, suspended, ttl(2 * time.Second), deleting}, 0},
		{"recorded before its time", []step{withTTL(9*time.Second, false), attached1, ttl(9 * time.Second), deleting}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vs := check.Log(build(t, c.steps...), check.Options{})
			switch {
			case c.seq == 0 && len(vs) != 0:
				t.Fatalf("violations %v; want none", vs)
			case c.seq != 0 && (len(vs) != 1 || vs[0].Rule != check.RuleExpiry || vs[0].Seq != c.seq):
				t.Fatalf("violations %v; want one of rule expiry at seq %d", vs, c.seq)
			}
		})
	}
}
