package check_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/storetest"
)

const id = "0193b0a4-0000-7000-8000-000000000001"

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// step is one event of a hand-written log: the event, the phase the
// contract puts the sandbox in after it, and its command id.
type step struct {
	e     events.Event
	phase events.Phase
	cmd   string
}

// build turns steps into a log, a second apart, seq from 1.
func build(t *testing.T, steps ...step) []events.Envelope {
	t.Helper()
	out := make([]events.Envelope, len(steps))
	for i, s := range steps {
		env, err := events.NewEnvelope(id, s.e, events.Meta{CommandID: s.cmd}, t0.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		env.Seq, env.Phase = uint64(i+1), s.phase
		out[i] = env
	}
	return out
}

var (
	created   = step{&events.Created{Name: "a", Driver: "sim", Generation: 1}, "provisioning", "c1"}
	createdN1 = step{&events.Created{Name: "a", Driver: "vm", Node: "n1", Generation: 1}, "provisioning", "c1"}
	attached1 = step{&events.SupervisorAttached{Generation: 1}, "ready", ""}
	suspend1  = step{&events.SuspendRequested{Generation: 1}, "suspending", "c2"}
	suspended = step{&events.Suspended{Generation: 1, RestoreRef: "r1"}, "suspended", "c2"}
	resume2   = step{&events.ResumeRequested{Generation: 2, RestoreRef: "r1"}, "starting", "c3"}
	consumed2 = step{&events.RetainedStateConsumed{Generation: 2, RestoreRef: "r1"}, "starting", "c3"}
	resumed2  = step{&events.Resumed{Generation: 2, Outcome: "restored"}, "starting", "c3"}
	attached2 = step{&events.SupervisorAttached{Generation: 2}, "ready", ""}
	// resumedReady is the saga's record of the restore after the attach.
	resumedReady = step{&events.Resumed{Generation: 2, Outcome: "restored"}, "ready", "c3"}
)

// TestCleanLogs: the contract's own paths have no violation.
func TestCleanLogs(t *testing.T) {
	logs := map[string][]step{
		"suspend and resume": {created, attached1, suspend1, suspended, resume2, consumed2, resumed2, attached2},
		// Issue 24, hole 5: the retained workload of generation 1 is the
		// sandbox's after a resume to 2 failed without consuming it.
		"the retained workload dies after a failed resume": {created, attached1, suspend1, suspended, resume2,
			{&events.ResumeFailed{Generation: 2}, "suspended", "c3"},
			{&events.Exited{Generation: 1, Code: 7}, "error", ""},
			{&events.RetainedStateInvalidated{RestoreRef: "r1"}, "error", ""}},
		"resume fails before consuming, then again": {created, attached1, suspend1, suspended, resume2,
			{&events.ResumeFailed{Generation: 2}, "suspended", "c3"},
			{&events.ResumeRequested{Generation: 3, RestoreRef: "r1"}, "starting", "c4"},
			{&events.RetainedStateConsumed{Generation: 3, RestoreRef: "r1"}, "starting", "c4"},
			{&events.SupervisorAttached{Generation: 3}, "ready", ""}},
		"strict restore lost, then a cold start": {created, attached1, suspend1, suspended, resume2, consumed2,
			{&events.Stopped{Generation: 2, Reason: events.ReasonRetainedStateLost}, "stopped", "c3"},
			{&events.StartRequested{Generation: 3}, "starting", "c4"},
			{&events.SupervisorAttached{Generation: 3}, "ready", ""}},
		"explicit start of a suspended sandbox": {created, attached1, suspend1, suspended,
			{&events.StartRequested{Generation: 2}, "starting", "c3"},
			{&events.RetainedStateDiscarded{RestoreRef: "r1"}, "starting", "c3"},
			{&events.SupervisorAttached{Generation: 2}, "ready", ""}},
		"exit while suspended": {created, attached1, suspend1, suspended,
			{&events.Exited{Generation: 1, Code: 137}, "error", ""},
			{&events.RetainedStateInvalidated{RestoreRef: "r1"}, "error", ""}},
		"delete while suspended": {created, attached1, suspend1, suspended,
			{&events.DeleteRequested{}, "deleting", "c3"},
			{&events.RetainedStateInvalidated{RestoreRef: "r1"}, "deleting", "c3"},
			{&events.Deleted{}, "deleted", "c3"}},
		"a deadline settles suspending": {created, attached1, suspend1,
			{&events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, "ready", "c2"},
			{&events.DeadlinePassed{Phase: "suspending"}, "ready", "c2"}},
		"a deadline settles stopping, the workload running": {created, attached1,
			{&events.StopRequested{Generation: 1}, "stopping", "c2"},
			{&events.StopRejected{Generation: 1}, "ready", "c2"},
			{&events.DeadlinePassed{Phase: "stopping"}, "ready", "c2"}},
		"a resume's deadline before the consumption": {created, attached1, suspend1, suspended, resume2,
			{&events.ResumeFailed{Generation: 2}, "suspended", "c3"},
			{&events.DeadlinePassed{Phase: "starting"}, "suspended", "c3"}},
		"a restore lost after the consumption falls back to a cold start": {created, attached1, suspend1, suspended,
			{&events.ResumeRequested{Generation: 2, RestoreRef: "r1", RestartIfRestoreFails: true}, "starting", "c3"},
			consumed2,
			{&events.StartRequested{Generation: 3, Fallback: true}, "starting", "c3"},
			{&events.Started{Generation: 3}, "starting", "c3"},
			{&events.SupervisorAttached{Generation: 3}, "ready", ""}},
		"the restore recorded after the attach": {created, attached1, suspend1, suspended, resume2, consumed2, attached2, resumedReady},
		"a start, an exit, a delete": {created,
			{&events.Started{Generation: 1}, "provisioning", "c1"},
			attached1,
			{&events.ForwardOpened{ForwardID: "f1", Port: 80}, "ready", "c2"},
			{&events.Exited{Generation: 1, Code: 2}, "error", ""},
			{&events.ForwardClosed{ForwardID: "f1"}, "error", ""},
			{&events.DeleteRequested{}, "deleting", "c3"},
			{&events.Deleted{}, "deleted", "c3"}},
		"a resume's deadline, nothing saying the state is held, ends in error": {created, attached1, suspend1, suspended, resume2,
			{&events.DeadlinePassed{Phase: "starting"}, "error", "c3"},
			{&events.CleanupRequested{Generation: 2, Action: events.CleanupStop}, "error", "c3"},
			{&events.CleanedUp{Generation: 2, Action: events.CleanupStop}, "error", "c3"}},
		"activity in every phase a sandbox can be active in": {created,
			{&events.Active{Source: events.ActiveTouch, At: t0}, "provisioning", "c2"},
			attached1,
			{&events.Active{Source: events.ActiveForward, At: t0}, "ready", ""},
			suspend1,
			{&events.Active{Source: events.ActiveSupervisor, At: t0}, "suspending", ""},
			suspended,
			{&events.Active{Source: events.ActiveTouch, At: t0}, "suspended", "c4"},
			resume2, consumed2,
			{&events.Active{Source: events.ActiveForward, At: t0}, "starting", ""},
			resumed2, attached2,
			{&events.StopRequested{Generation: 2}, "stopping", "c5"},
			{&events.Active{Source: events.ActiveForward, At: t0}, "stopping", ""},
			{&events.Stopped{Generation: 2}, "stopped", "c5"},
			{&events.Active{Source: events.ActiveTouch, At: t0}, "stopped", "c6"}},
		"a deadline ends provisioning in error": {created,
			{&events.DeadlinePassed{Phase: "provisioning"}, "error", "c1"},
			{&events.CleanupRequested{Generation: 1, Action: events.CleanupStop}, "error", "c1"}},
		// Issue 29: a target that cannot restore says so before anything
		// is consumed; the same resume elsewhere, then on a third node.
		"targets refuse a resume, then one restores": {createdN1, attached1, suspend1, suspended, resume2,
			{&events.ResumeFailed{Generation: 2, Node: "n1", Reason: events.ReasonCannotRestore, Message: "too little memory"}, "suspended", "c3"},
			{&events.ResumeRequested{Generation: 3, RestoreRef: "r1", Node: "n2"}, "starting", "c4"},
			{&events.ResumeFailed{Generation: 3, Node: "n2", Reason: events.ReasonCannotRestore, Message: "no machine type microvm"}, "suspended", "c4"},
			{&events.ResumeRequested{Generation: 4, RestoreRef: "r1", Node: "n3"}, "starting", "c5"},
			{&events.RetainedStateConsumed{Generation: 4, RestoreRef: "r1", Node: "n3", Via: "r1@n3"}, "starting", "c5"},
			{&events.SupervisorAttached{Generation: 4}, "ready", ""},
			{&events.SuspendRequested{Generation: 4}, "suspending", "c6"},
			{&events.Suspended{Generation: 4, RestoreRef: "r4"}, "suspended", "c6"},
			{&events.ResumeRequested{Generation: 5, RestoreRef: "r4"}, "starting", "c7"},
			{&events.ResumeFailed{Generation: 5, Node: "n3", Reason: events.ReasonCannotRestore, Message: "too little disk"}, "suspended", "c7"}},
	}
	for name, steps := range logs {
		t.Run(name, func(t *testing.T) {
			log := build(t, steps...)
			if vs := check.Log(log, check.Options{}); len(vs) != 0 {
				t.Fatalf("violations in a clean log: %v", vs)
			}
			// Every stay is a second or so: within a deadline of ten.
			o := check.Options{Deadline: 10 * time.Second, Now: log[len(log)-1].Time.Add(time.Second)}
			if vs := check.Log(log, o); len(vs) != 0 {
				t.Fatalf("violations in a clean log, under a deadline: %v", vs)
			}
		})
	}
}

// TestViolations: each log breaks one invariant, and the check names it at
// the event that shows it.
func TestViolations(t *testing.T) {
	cases := []struct {
		name      string
		steps     []step
		invariant int
		seq       uint64
		rule      string // when set, the violation's rule too
	}{
		{"suspended again after the consumption", []step{created, attached1, suspend1, suspended, resume2, consumed2,
			{&events.ResumeFailed{Generation: 2}, "suspended", "c3"}}, check.RetainedStateOnce, 7, ""},
		{"a resume of a consumed reference", []step{created, attached1, suspend1, suspended, resume2, consumed2,
			{&events.ResumeFailed{Generation: 2}, "suspended", "c3"},
			{&events.ResumeRequested{Generation: 3, RestoreRef: ""}, "starting", "c4"}}, check.RetainedStateOnce, 8, ""},
		{"a suspension on a discarded reference", []step{created, attached1, suspend1, suspended,
			{&events.StartRequested{Generation: 2}, "starting", "c3"},
			{&events.RetainedStateDiscarded{RestoreRef: "r1"}, "starting", "c3"},
			{&events.SupervisorAttached{Generation: 2}, "ready", ""},
			{&events.SuspendRequested{Generation: 2}, "suspending", "c4"},
			{&events.Suspended{Generation: 2, RestoreRef: "r1"}, "suspended", "c4"}}, check.RetainedStateOnce, 9, ""},
		{"a second exit of a generation", []step{created, attached1,
			{&events.StopRequested{Generation: 1}, "stopping", "c2"},
			{&events.Exited{Generation: 1, Code: 3}, "stopping", ""},
			{&events.Exited{Generation: 1, Code: 0}, "stopping", ""}}, check.ExitKept, 5, ""},
		{"a start that mints no new generation", []step{created, attached1,
			{&events.StopRequested{Generation: 1}, "stopping", "c2"},
			{&events.Stopped{Generation: 1}, "stopped", "c2"},
			{&events.StartRequested{Generation: 1}, "starting", "c3"}}, check.GenerationsFenced, 5, ""},
		{"an old generation's report recorded", []step{created, attached1, suspend1, suspended, resume2, consumed2, resumed2, attached2,
			{&events.Exited{Generation: 1, Code: 9}, "error", ""}}, check.GenerationsFenced, 9, ""},
		{"a failed resume's generation reports in suspended", []step{created, attached1, suspend1, suspended, resume2,
			{&events.ResumeFailed{Generation: 2}, "suspended", "c3"},
			{&events.Exited{Generation: 2, Code: 9}, "error", ""}}, check.GenerationsFenced, 7, ""},
		{"a command appended twice", []step{created, attached1, suspend1,
			{&events.SuspendRejected{Generation: 1}, "ready", "c2"},
			{&events.SuspendRequested{Generation: 1}, "suspending", "c2"}}, check.CommandsOnce, 5, ""},
		{"a passed deadline that leaves a transient phase", []step{created,
			{&events.DeadlinePassed{Phase: "provisioning"}, "provisioning", ""}}, check.TransientsHaveAnEnd, 2, check.RuleSettles},

		// The phase stamp is judged, never trusted.
		{"a stamp that is not the phase the events lead to", []step{
			{&events.Created{Name: "a", Driver: "sim", Generation: 1}, "ready", "c1"}}, check.Lifecycle, 1, check.RuleStamp},
		{"error left by a stamp", []step{created, attached1,
			{&events.Exited{Generation: 1, Code: 2}, "error", ""},
			{&events.RetainedStateInvalidated{RestoreRef: "r0"}, "ready", ""}}, check.Lifecycle, 4, check.RuleTerminal},
		// Rows the views' table takes where CONTRACT §1 does not.
		{"a deadline of ready without a compensation", []step{created, attached1,
			{&events.DeadlinePassed{Phase: "ready"}, "ready", ""}}, check.Lifecycle, 3, check.RuleTable},
		{"restored before the consumption", []step{created, attached1, suspend1, suspended, resume2,
			{&events.Resumed{Generation: 2, Outcome: "restored"}, "starting", "c3"}}, check.Lifecycle, 6, check.RuleTable},
		{"restored in a cold start", []step{created, attached1,
			{&events.StopRequested{Generation: 1}, "stopping", "c2"},
			{&events.Stopped{Generation: 1}, "stopped", "c2"},
			{&events.StartRequested{Generation: 2}, "starting", "c3"},
			{&events.Resumed{Generation: 2, Outcome: "restored"}, "starting", ""}}, check.Lifecycle, 6, check.RuleTable},
		{"a cold start stopped with no stop", []step{created, attached1,
			{&events.StopRequested{Generation: 1}, "stopping", "c2"},
			{&events.Stopped{Generation: 1}, "stopped", "c2"},
			{&events.StartRequested{Generation: 2}, "starting", "c3"},
			{&events.Stopped{Generation: 2}, "stopped", ""}}, check.Lifecycle, 6, check.RuleTable},
		// Invariant 1: suspended, held, after the consumption (issue 24, hole 2).
		{"a resume's deadline suspends on a consumed reference", []step{created, attached1, suspend1, suspended, resume2, consumed2,
			{&events.ResumeFailed{Generation: 2}, "suspended", "c3"},
			{&events.DeadlinePassed{Phase: "starting"}, "suspended", "c3"}}, check.RetainedStateOnce, 7, check.RuleRetained},
		// Invariant 4: an intent has at most one outcome.
		{"a restore recorded twice (two writers)", []step{created, attached1, suspend1, suspended, resume2, consumed2, resumed2, attached2,
			resumedReady}, check.CommandsOnce, 9, check.RuleOutcome},
		{"the retained state consumed twice", []step{created, attached1, suspend1, suspended, resume2, consumed2, consumed2},
			check.CommandsOnce, 7, check.RuleOutcome},
		// Issue 29: only the resume's target refuses it.
		{"a refusal by another node than the target", []step{createdN1, attached1, suspend1, suspended,
			{&events.ResumeRequested{Generation: 2, RestoreRef: "r1", Node: "n2"}, "starting", "c3"},
			{&events.ResumeFailed{Generation: 2, Node: "n1", Reason: events.ReasonCannotRestore}, "suspended", "c3"}},
			check.Lifecycle, 6, check.RuleRefusal},
		{"a refusal by another node than the sandbox's", []step{createdN1, attached1, suspend1, suspended, resume2,
			{&events.ResumeFailed{Generation: 2, Node: "n2", Reason: events.ReasonCannotRestore}, "suspended", "c3"}},
			check.Lifecycle, 6, check.RuleRefusal},
		{"a start answered twice", []step{created,
			{&events.Started{Generation: 1}, "provisioning", "c1"},
			{&events.StartFailed{Generation: 1}, "error", "c1"}}, check.CommandsOnce, 3, check.RuleOutcome},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vs := check.Log(build(t, c.steps...), check.Options{})
			for _, v := range vs {
				if v.Invariant == c.invariant && v.Seq == c.seq && v.SandboxID == id && (c.rule == "" || v.Rule == c.rule) {
					return
				}
			}
			t.Fatalf("violations %v; want one of invariant %d (%q) at seq %d", vs, c.invariant, c.rule, c.seq)
		})
	}
}

// TestActivityOutsideActivePhases: sandbox.active in deleting or in a
// terminal phase is refused by CONTRACT §1 as the README words it and by
// the views' table: passed over by every reader, counted, no violation.
func TestActivityOutsideActivePhases(t *testing.T) {
	for name, steps := range map[string][]step{
		"deleting": {created, attached1, {&events.DeleteRequested{}, "deleting", "c2"}},
		"error":    {created, attached1, {&events.Exited{Generation: 1, Code: 2}, "error", ""}},
		"deleted":  {created, attached1, {&events.DeleteRequested{}, "deleting", "c2"}, {&events.Deleted{}, "deleted", "c2"}},
	} {
		t.Run(name, func(t *testing.T) {
			steps = append(steps, step{&events.Active{Source: events.ActiveTouch, At: t0}, events.Phase(name), "c9"})
			log := build(t, steps...)
			var refused []uint64
			vs := check.Log(log, check.Options{Refused: func(env events.Envelope, err error) { refused = append(refused, env.Seq) }})
			if want := uint64(len(log)); len(vs) != 0 || len(refused) != 1 || refused[0] != want {
				t.Fatalf("violations %v, refused %v; want none and seq %d refused", vs, refused, want)
			}
		})
	}
}

// TestEventAppendedTwice: the same event id twice is a command landed twice.
func TestEventAppendedTwice(t *testing.T) {
	log := build(t, created, attached1, suspend1)
	dup := log[2]
	dup.Seq = 4
	vs := check.Log(append(log, dup), check.Options{})
	if len(vs) == 0 || vs[0].Invariant != check.CommandsOnce || vs[0].Seq != 4 {
		t.Fatalf("violations %v; want invariant 4 at seq 4", vs)
	}
}

// TestStuck: with a deadline and the time of the check, a sandbox left in
// a transient phase past the deadline is reported; one within it is not.
func TestStuck(t *testing.T) {
	log := build(t, created, attached1, suspend1) // suspending since t0+2s
	o := check.Options{Deadline: time.Minute, Slack: time.Second, Now: t0.Add(2*time.Second + time.Minute)}
	if vs := check.Log(log, o); len(vs) != 0 {
		t.Fatalf("within the deadline: %v", vs)
	}
	o.Now = o.Now.Add(5 * time.Second)
	vs := check.Log(log, o)
	if len(vs) != 1 || vs[0].Invariant != check.TransientsHaveAnEnd || vs[0].Seq != 3 {
		t.Fatalf("past the deadline: %v; want invariant 5 at seq 3", vs)
	}
}

func ExampleLog() {
	var log []events.Envelope
	for i, e := range []events.Event{
		&events.Created{Name: "a", Driver: "sim", Generation: 1},
		&events.SupervisorAttached{Generation: 1},
		&events.SuspendRequested{Generation: 1},
		&events.Suspended{Generation: 1, RestoreRef: "r1"},
		&events.ResumeRequested{Generation: 2, RestoreRef: "r1"},
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: "r1"},
		&events.ResumeFailed{Generation: 2}, // "not consumed": suspended on a consumed reference
	} {
		env, _ := events.NewEnvelope(id, e, events.Meta{}, t0)
		env.Seq = uint64(i + 1)
		log = append(log, env)
	}
	for _, v := range check.Log(log, check.Options{}) {
		fmt.Println(v)
	}
	// Output:
	// sandbox 0193b0a4-0000-7000-8000-000000000001 seq 7: invariant 1: suspended on reference "r1", consumed or invalidated
}

// TestAll: a whole log, sandboxes interleaved, is checked sandbox by
// sandbox: one sandbox's events never count against another's.
func TestAll(t *testing.T) {
	const other = "0193b0a4-0000-7000-8000-000000000002"
	a := build(t, created, attached1, suspend1, suspended)
	b := build(t, created, attached1)
	for i := range b {
		b[i].SandboxID = other
	}
	bad, _ := events.NewEnvelope(other, &events.Exited{Generation: 7, Code: 1}, events.Meta{}, t0)
	bad.Seq, bad.Phase = 99, events.PhaseError
	log := []events.Envelope{a[0], b[0], a[1], b[1], a[2], bad, a[3]}
	vs := check.All(log, check.Options{})
	if len(vs) != 1 || vs[0].SandboxID != other || vs[0].Seq != 99 || vs[0].Invariant != check.GenerationsFenced {
		t.Fatalf("violations %v; want the one of %s at seq 99", vs, other)
	}
}

// TestForgedEventsCountedNotFollowed: events the lifecycle table refuses
// (forged on the bus, whatever phase they are stamped with) are counted
// and change nothing: no violation appears or disappears for them, and a
// hung stop is still reported stuck past its deadline. A forged event the
// table takes is followed, and its stamp judged like any other.
func TestForgedEventsCountedNotFollowed(t *testing.T) {
	stop := []step{created, attached1,
		{&events.StopRequested{Generation: 1}, "stopping", "c2"}}
	hung := build(t, stop...) // stopping since t0+2s
	forged := storetest.ForgedStopping(id, 1, t0.Add(3*time.Second))
	for i := range forged {
		forged[i].Seq = uint64(len(hung) + 1 + i)
	}
	var refused []string
	o := check.Options{Deadline: time.Minute, Now: t0.Add(time.Hour), Refused: func(env events.Envelope, err error) {
		refused = append(refused, env.Type)
	}}
	// The exit, which the table takes in stopping, is stamped error: a
	// reader that trusted the stamp would show error, so the stamp is
	// reported; the hung stop is reported at the end.
	vs := check.Log(append(hung, forged...), o)
	exit := uint64(len(hung) + 3)
	if len(vs) != 2 || vs[0].Rule != check.RuleStamp || vs[0].Seq != exit ||
		vs[1].Invariant != check.TransientsHaveAnEnd || !strings.HasPrefix(vs[1].Message, "stopping for") {
		t.Errorf("violations %v; want the forged exit's stamp (seq %d) and the hung stop (invariant 5, stopping) only", vs, exit)
	}
	// All but the exit, which the table takes in stopping as a fact.
	if want := len(forged) - 1; len(refused) != want {
		t.Errorf("refused %v; want %d", refused, want)
	}

	stopped := build(t, append(stop, step{&events.Stopped{Generation: 1}, "stopped", "c2"})...)
	forged = storetest.Forged(id, 1, t0.Add(4*time.Second))
	for i := range forged {
		forged[i].Seq = uint64(len(stopped) + 1 + i)
	}
	refused = nil
	if vs := check.Log(append(stopped, forged...), o); len(vs) != 0 {
		t.Errorf("violations %v on a stopped sandbox with forged events; want none", vs)
	}
	if len(refused) != len(forged) {
		t.Errorf("refused %v; want all %d", refused, len(forged))
	}
}

// TestStaysPastTheDeadline: a transient stay longer than the deadline and
// its slack is reported, whether it ended or not; one within it is not.
func TestStaysPastTheDeadline(t *testing.T) {
	stop := step{&events.StopRequested{Generation: 1}, "stopping", "c2"}
	stopped := step{&events.Stopped{Generation: 1}, "stopped", "c2"}
	o := check.Options{Deadline: time.Minute, Slack: time.Second}
	cases := []struct {
		name  string
		steps []step
		took  time.Duration // from the third event (the stop) to the fourth
		want  []uint64      // seqs of the violations
	}{
		{"a stop within the deadline", []step{created, attached1, stop, stopped}, time.Minute, nil},
		{"a stop that ended past the deadline", []step{created, attached1, stop, stopped}, time.Minute + 2*time.Second, []uint64{4}},
		{"a suspension that ended past the deadline", []step{created, attached1, suspend1, suspended}, time.Hour, []uint64{4}},
		{"a provisioning of a detach that ended past the deadline", []step{created, attached1,
			{&events.SupervisorDetached{Generation: 1}, "provisioning", ""}, attached1}, 2 * time.Minute, []uint64{4}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			log := build(t, c.steps...)
			log[3].Time = log[2].Time.Add(c.took)
			var got []uint64
			for _, v := range check.Log(log, o) {
				if v.Invariant != check.TransientsHaveAnEnd || v.Rule != check.RuleStay {
					t.Errorf("violation %v; want invariant 5 (stay)", v)
				}
				got = append(got, v.Seq)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("violations at %v; want at %v", got, c.want)
			}
			// Without a deadline, stays are not judged.
			if vs := check.Log(log, check.Options{}); len(vs) != 0 {
				t.Errorf("violations without a deadline: %v", vs)
			}
		})
	}
}

// raw is an envelope of a type this build may not know, as the log holds it.
func raw(typ string, seq uint64, at time.Time) events.Envelope {
	return events.Envelope{ID: fmt.Sprintf("raw-%d", seq), SandboxID: id, Type: typ, Schema: events.SchemaVersion,
		Time: at, Phase: events.PhaseError, Data: []byte(`{}`), Seq: seq}
}

// TestDeadlineCleanup: a deadline that ends a phase in error tells the
// driver to clean up (CONTRACT §1); a clean-up asked for and not confirmed
// past the deadline is reported, and so is, by default (every writer
// records clean-ups), a deadline in error with none asked for; a log
// older than that (CleanupUnrecorded) is not judged on it.
func TestDeadlineCleanup(t *testing.T) {
	log := build(t, created, step{&events.DeadlinePassed{Phase: "provisioning"}, "error", "c1"})
	asked := raw(check.TypeCleanupRequested, 3, t0.Add(2*time.Second))
	done := raw(check.TypeCleanedUp, 4, t0.Add(3*time.Second))
	late := check.Options{Deadline: time.Minute, Slack: time.Second, Now: t0.Add(time.Hour)}
	soon := late
	soon.Now = t0.Add(30 * time.Second)
	unrecorded := late
	unrecorded.CleanupUnrecorded = true
	cases := []struct {
		name string
		log  []events.Envelope
		o    check.Options
		want []uint64
	}{
		{"asked for and done", append(log[:2:2], asked, done), late, nil},
		{"asked for, not done, within the deadline", append(log[:2:2], asked), soon, nil},
		{"asked for, not done, past the deadline", append(log[:2:2], asked), late, []uint64{3}},
		{"never asked for, the writer records none", log, unrecorded, nil},
		{"never asked for, the writer records them", log, late, []uint64{2}},
		{"never asked for, by default", log, check.Options{}, []uint64{2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []uint64
			for _, v := range check.Log(c.log, c.o) {
				if v.Invariant != check.TransientsHaveAnEnd || v.Rule != check.RuleCleanup {
					t.Errorf("violation %v; want invariant 5 (cleanup)", v)
				}
				got = append(got, v.Seq)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("violations at %v; want at %v", got, c.want)
			}
		})
	}
}
