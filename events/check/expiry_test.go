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
