package gateway

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

const sid = "0193b0a4-0000-7000-8000-000000000001"

// given folds evs into a fresh aggregate, as the log would.
func given(t *testing.T, evs ...events.Event) *Sandbox {
	t.Helper()
	sb := &Sandbox{ID: sid}
	for i, e := range evs {
		env, err := events.NewEnvelope(sid, e, events.Meta{CommandID: "c" + string(rune('a'+i))}, time.Unix(int64(i), 0))
		if err != nil {
			t.Fatal(err)
		}
		env.Seq = uint64(i + 1)
		if err := sb.apply(env); err != nil {
			t.Fatalf("given event %d %s: %v", i, e.Type(), err)
		}
	}
	return sb
}

var (
	created    = &events.Created{Name: "a", Driver: "sim", Node: "local", Generation: 1}
	attached1  = &events.SupervisorAttached{Generation: 1}
	ready      = []events.Event{created, &events.Started{Generation: 1}, attached1}
	suspending = append(ready[:3:3], &events.SuspendRequested{Generation: 1})
	suspended  = append(suspending[:4:4], &events.Suspended{Generation: 1, RestoreRef: "ref-1"})
	resuming   = append(suspended[:5:5], &events.ResumeRequested{Generation: 2, RestoreRef: "ref-1"})
	resumed    = append(resuming[:6:6], &events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}, &events.Resumed{Generation: 2, Outcome: "restored"}, &events.SupervisorAttached{Generation: 2})
	stopping   = append(ready[:3:3], &events.StopRequested{Generation: 1})
	stopped    = append(stopping[:4:4], &events.Stopped{Generation: 1})
	exited     = append(ready[:3:3], &events.Exited{Generation: 1, Code: 3})
	deleted    = append(ready[:3:3], &events.DeleteRequested{}, &events.Deleted{})
	canSuspend = compute.Capabilities{Suspend: true}
)

// TestDecide reads given (events) / when (command) / then (events or error).
func TestDecide(t *testing.T) {
	cases := []struct {
		name  string
		given []events.Event
		when  Command
		caps  compute.Capabilities
		then  []events.Event
		code  events.Code
	}{
		{name: "create on nothing", when: Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "a", Driver: "sim"}, Node: "n1"},
			then: []events.Event{&events.Created{Name: "a", Driver: "sim", Node: "n1", Generation: 1}}},
		{name: "create on an existing id", given: ready, when: Command{Verb: VerbCreate}, code: events.CodeAlreadyExists},
		{name: "any verb on an unknown sandbox", when: Command{Verb: VerbSuspend, ID: sid}, caps: canSuspend, code: events.CodeNotFound},

		{name: "suspend ready", given: ready, when: Command{Verb: VerbSuspend}, caps: canSuspend,
			then: []events.Event{&events.SuspendRequested{Generation: 1}}},
		{name: "suspend suspended is a no-op", given: suspended, when: Command{Verb: VerbSuspend}, caps: canSuspend},
		{name: "suspend suspending is a no-op", given: suspending, when: Command{Verb: VerbSuspend}, caps: canSuspend},
		{name: "suspend without the capability", given: ready, when: Command{Verb: VerbSuspend}, code: events.CodeUnimplemented},
		{name: "suspend stopped", given: stopped, when: Command{Verb: VerbSuspend}, caps: canSuspend, code: events.CodeFailedPrecondition},
		{name: "suspend provisioning", given: ready[:1], when: Command{Verb: VerbSuspend}, caps: canSuspend, code: events.CodeFailedPrecondition},

		{name: "resume suspended", given: suspended, when: Command{Verb: VerbResume, RestartIfRestoreFails: true},
			then: []events.Event{&events.ResumeRequested{Generation: 2, RestoreRef: "ref-1", RestartIfRestoreFails: true}}},
		{name: "resume ready after a resume is a no-op", given: resumed, when: Command{Verb: VerbResume}},
		{name: "resume while resuming is a no-op", given: resuming, when: Command{Verb: VerbResume}},
		{name: "resume ready never suspended", given: ready, when: Command{Verb: VerbResume}, code: events.CodeFailedPrecondition},
		{name: "resume stopped", given: stopped, when: Command{Verb: VerbResume}, code: events.CodeFailedPrecondition},
		{name: "resume ready after a later stop and start", given: append(resumed[:9:9], &events.StopRequested{Generation: 2}, &events.Stopped{Generation: 2}, &events.StartRequested{Generation: 3}, &events.SupervisorAttached{Generation: 3}),
			when: Command{Verb: VerbResume}, code: events.CodeFailedPrecondition},

		{name: "stop ready", given: ready, when: Command{Verb: VerbStop}, then: []events.Event{&events.StopRequested{Generation: 1}}},
		{name: "stop stopped is a no-op", given: stopped, when: Command{Verb: VerbStop}},
		{name: "stop stopping is a no-op", given: stopping, when: Command{Verb: VerbStop}},
		{name: "stop suspended", given: suspended, when: Command{Verb: VerbStop}, code: events.CodeFailedPrecondition},
		{name: "stop error", given: exited, when: Command{Verb: VerbStop}, code: events.CodeFailedPrecondition},

		{name: "start stopped mints a generation", given: stopped, when: Command{Verb: VerbStart}, then: []events.Event{&events.StartRequested{Generation: 2}}},
		{name: "start ready is a no-op", given: ready, when: Command{Verb: VerbStart}},
		{name: "start suspended discards the retained state", given: suspended, when: Command{Verb: VerbStart},
			then: []events.Event{&events.StartRequested{Generation: 2}, &events.RetainedStateDiscarded{RestoreRef: "ref-1"}}},
		{name: "start error", given: exited, when: Command{Verb: VerbStart}, code: events.CodeFailedPrecondition},
		{name: "start deleted", given: deleted, when: Command{Verb: VerbStart}, code: events.CodeFailedPrecondition},

		{name: "delete ready", given: ready, when: Command{Verb: VerbDelete}, then: []events.Event{&events.DeleteRequested{}}},
		{name: "delete error", given: exited, when: Command{Verb: VerbDelete}, then: []events.Event{&events.DeleteRequested{}}},
		{name: "delete suspended", given: suspended, when: Command{Verb: VerbDelete}, then: []events.Event{&events.DeleteRequested{}}},
		{name: "delete deleted is a no-op", given: deleted, when: Command{Verb: VerbDelete}},

		{name: "a repeated command id is a no-op", given: ready, when: Command{Verb: VerbStop, CommandID: "cb"}},
		{name: "an unknown verb", given: ready, when: Command{Verb: "explode"}, code: events.CodeInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sb := given(t, c.given...)
			c.when.ID = sid
			got, err := decide(sb, c.when, c.caps)
			if code := events.CodeOf(err); code != c.code {
				t.Fatalf("error %v (code %q), want code %q", err, code, c.code)
			}
			if len(got) != len(c.then) || (len(got) > 0 && !reflect.DeepEqual(got, c.then)) {
				t.Fatalf("events %#v, want %#v", got, c.then)
			}
			// What decide returns must be accepted by the table.
			phase := sb.Phase
			for _, e := range got {
				next, err := Next(phase, e.Type())
				if err != nil {
					t.Fatalf("decided %s that the table refuses: %v", e.Type(), err)
				}
				phase = next
			}
		})
	}
}

// TestFence: reports from other generations change nothing, and an exit
// result is never overwritten.
func TestFence(t *testing.T) {
	cases := []struct {
		name  string
		given []events.Event
		e     events.Event
		ok    bool
	}{
		{"attach of the current generation", ready[:2], attached1, true},
		{"attach of an old generation", resuming, attached1, false},
		{"exit of an old generation while suspended", resuming[:5], &events.Exited{Generation: 0}, false},
		{"a second exit", exited, &events.Exited{Generation: 1, Code: 9}, false},
		{"fallback start mints the next generation", append(resuming[:6:6], &events.RetainedStateConsumed{Generation: 2}), &events.StartRequested{Generation: 3, Fallback: true}, true},
		{"a start that reuses a generation", stopped, &events.StartRequested{Generation: 1}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := fence(given(t, c.given...), c.e)
			if (err == nil) != c.ok {
				t.Fatalf("fence = %v, want ok=%v", err, c.ok)
			}
			if err != nil && events.CodeOf(err) != events.CodeFailedPrecondition {
				t.Fatalf("code %s, want FAILED_PRECONDITION", events.CodeOf(err))
			}
		})
	}
}

// TestApplyRefusesUnknownTypes: the aggregate does not guess.
func TestApplyRefusesUnknownTypes(t *testing.T) {
	sb := given(t, ready...)
	env := events.Envelope{SandboxID: sid, Type: "sandbox.from_the_future", Data: []byte(`{}`), Seq: 9}
	err := sb.apply(env)
	if !errors.Is(err, events.ErrUnknownType) {
		t.Fatalf("apply unknown type: %v, want ErrUnknownType", err)
	}
	if sb.Phase != events.PhaseReady || sb.Seq != 3 {
		t.Fatalf("state moved on a refused event: %s seq %d", sb.Phase, sb.Seq)
	}
}

// TestViewFollowsTheAggregate: the view folded with the aggregate carries the
// contract's fields through a suspend/resume cycle.
func TestViewFollowsTheAggregate(t *testing.T) {
	sb := given(t, suspended...)
	if v := sb.View; v.Phase != events.PhaseSuspended || !v.Restore.Held || v.Restore.Consumed || v.Seq != 5 {
		t.Fatalf("suspended view %+v", v)
	}
	sb = given(t, resumed...)
	if v := sb.View; v.Phase != events.PhaseReady || v.Restore.Held || !v.Restore.Consumed || v.Generation != 2 || v.LastOutcome != "restored" {
		t.Fatalf("resumed view %+v", v)
	}
	sb = given(t, exited...)
	if v := sb.View; v.Phase != events.PhaseError || v.ExitCode == nil || *v.ExitCode != 3 || v.Reason != events.ReasonMainProcessExited {
		t.Fatalf("exited view %+v", v)
	}
}

// TestAttachAwaitsTheResume: a started or resumed generation's supervisor
// may report before the saga records the driver's answer; its attach and
// exit wait for the saga's record (one writer per fact: the start, the
// consumption and the restore are the saga's), and are taken once it is
// recorded. A saga re-driven after its records adds nothing.
func TestAttachAwaitsTheResume(t *testing.T) {
	consumed := &events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}
	restored := &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}
	for _, tc := range []struct {
		name  string
		log   []events.Event
		gen   int64
		await bool
	}{
		{"resuming", resuming, 2, true},
		{"consumed, not restored", append(resuming[:6:6], consumed), 2, true},
		{"restored", append(resuming[:6:6], consumed, restored), 2, false},
		{"another generation", resuming, 1, false},
		{"created", ready[:1], 1, true},
		{"started", ready[:2], 1, false},
		{"a cold start", append(stopped[:5:5], &events.StartRequested{Generation: 2}), 2, true},
		{"a cold start, started", append(stopped[:5:5], &events.StartRequested{Generation: 2}, &events.Started{Generation: 2}), 2, false},
		{"the resume failed", append(resuming[:6:6], &events.ResumeFailed{Generation: 2}), 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := awaits(given(t, tc.log...), tc.gen) != ""; got != tc.await {
				t.Fatalf("awaits = %v, want %v", got, tc.await)
			}
		})
	}
	sb := given(t, append(resuming[:6:6], consumed, restored, &events.SupervisorAttached{Generation: 2})...)
	if v := sb.View; v.Phase != events.PhaseReady || v.Restore.Held || !v.Restore.Consumed || v.LastOutcome != events.OutcomeRestored {
		t.Fatalf("after the attach: %+v", v)
	}
	got, err := reported(sb, []events.Event{consumed, restored}, time.Now())
	if err != nil || len(got) != 0 {
		t.Fatalf("the re-driven saga's records: %#v, %v; want nothing (held already)", got, err)
	}
}

// TestRepeatedAttachIsHeld: a supervisor that attaches again while attached
// appends nothing (the bus answers it as taken); one that attaches after a
// detach, or after a resume minted its generation, is recorded.
func TestRepeatedAttachIsHeld(t *testing.T) {
	cases := []struct {
		name   string
		given  []events.Event
		attach int64
		want   int
	}{
		{"again while ready", ready, 1, 0},
		{"again while stopping", stopping, 1, 0},
		{"after a detach", append(ready[:3:3], &events.SupervisorDetached{Generation: 1}), 1, 1},
		{"the resumed generation", append(resuming[:6:6], &events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}), 2, 1},
		{"again after the resume", resumed, 2, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := reported(given(t, c.given...), []events.Event{&events.SupervisorAttached{Generation: c.attach}}, time.Now())
			if err != nil || len(got) != c.want {
				t.Fatalf("reported attach of %d: %#v, %v; want %d events", c.attach, got, err, c.want)
			}
		})
	}
}

// TestReportedTellsTheTruth: what a report appends, given the log: a
// failure the log disproves becomes the truth, an exit or a lost resource
// takes the retained state with it, a deadline that is not due is refused.
func TestReportedTellsTheTruth(t *testing.T) {
	consumed := append(resuming[:6:6], &events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"})
	fallback := append(suspended[:5:5], &events.ResumeRequested{Generation: 2, RestoreRef: "ref-1", RestartIfRestoreFails: true},
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"})
	entered := time.Unix(int64(len(suspending)-1), 0) // given() stamps event i at second i
	cases := []struct {
		name  string
		given []events.Event
		when  []events.Event
		now   time.Time
		then  []events.Event
		code  events.Code
	}{
		{name: "a restore failure before the consumption", given: resuming, when: []events.Event{&events.ResumeFailed{Generation: 2}},
			then: []events.Event{&events.ResumeFailed{Generation: 2}}},
		{name: "a failure 'before the consumption' once it is recorded, strict", given: consumed, when: []events.Event{&events.ResumeFailed{Generation: 2}},
			then: []events.Event{&events.Stopped{Generation: 2, Reason: events.ReasonRetainedStateLost}}},
		{name: "the same with the fallback", given: fallback, when: []events.Event{&events.ResumeFailed{Generation: 2}},
			then: []events.Event{&events.StartRequested{Generation: 3, Fallback: true}}},
		{name: "an exit while suspended", given: suspended, when: []events.Event{&events.Exited{Generation: 1, Code: 137}},
			then: []events.Event{&events.Exited{Generation: 1, Code: 137}, &events.RetainedStateInvalidated{RestoreRef: "ref-1"}}},
		{name: "the resource lost while suspended", given: suspended, when: []events.Event{&events.ResourceLost{Generation: 1}},
			then: []events.Event{&events.ResourceLost{Generation: 1}, &events.RetainedStateInvalidated{RestoreRef: "ref-1"}}},
		{name: "the consumption and then the exit a resume deadline observed", given: resuming,
			when: []events.Event{&events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}, &events.Exited{Generation: 2, Code: 5}},
			then: []events.Event{&events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}, &events.Exited{Generation: 2, Code: 5}}},
		{name: "an exit while ready", given: ready, when: []events.Event{&events.Exited{Generation: 1, Code: 3}},
			then: []events.Event{&events.Exited{Generation: 1, Code: 3}}},
		{name: "a restore failure with no resume under way", given: append(stopped[:5:5], &events.StartRequested{Generation: 2}),
			when: []events.Event{&events.ResumeFailed{Generation: 2}}, code: events.CodeFailedPrecondition},
		{name: "a fallback start with no resume under way", given: stopped, when: []events.Event{&events.StartRequested{Generation: 2, Fallback: true}},
			code: events.CodeFailedPrecondition},
		{name: "the retained state lost with no resume under way", given: stopping, when: []events.Event{&events.Stopped{Generation: 1, Reason: events.ReasonRetainedStateLost}},
			code: events.CodeFailedPrecondition},
		{name: "a restore before its consumption", given: resuming, when: []events.Event{&events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}},
			code: events.CodeFailedPrecondition},
		{name: "a restore after its consumption in the same report", given: resuming,
			when: []events.Event{&events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}},
			then: []events.Event{&events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}}},
		{name: "a consumption of no reference", given: append(stopped[:5:5], &events.StartRequested{Generation: 2}),
			when: []events.Event{&events.RetainedStateConsumed{Generation: 2}}},
		{name: "a deadline that is due", given: suspending, now: entered.Add(time.Minute),
			when: []events.Event{&events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, &events.DeadlinePassed{Phase: events.PhaseSuspending, Deadline: "1m0s"}},
			then: []events.Event{&events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, &events.DeadlinePassed{Phase: events.PhaseSuspending, Deadline: "1m0s"}}},
		{name: "a deadline that is not due yet", given: suspending, now: entered.Add(59 * time.Second),
			when: []events.Event{&events.DeadlinePassed{Phase: events.PhaseSuspending, Deadline: "1m0s"}}, code: events.CodeFailedPrecondition},
		{name: "a deadline of another phase", given: ready, now: entered.Add(time.Hour),
			when: []events.Event{&events.DeadlinePassed{Phase: events.PhaseSuspending, Deadline: "1m0s"}}, code: events.CodeFailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reportedIs(t, given(t, c.given...), c.when, c.now, c.code, c.then)
		})
	}
}

// TestResumeNeedsTheRetainedState: a log in which the consumption was
// followed by a restore failure (what builds before the guard wrote) is
// suspended without a retained state: a resume of it is refused.
func TestResumeNeedsTheRetainedState(t *testing.T) {
	sb := given(t, append(resuming[:6:6], &events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}, &events.ResumeFailed{Generation: 2})...)
	if sb.Phase != events.PhaseSuspended || sb.RestoreRef != "" {
		t.Fatalf("given %s holding %q", sb.Phase, sb.RestoreRef)
	}
	_, err := decide(sb, Command{Verb: VerbResume, ID: sid}, canSuspend)
	if events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "no retained state") {
		t.Fatalf("resume: %v; want FAILED_PRECONDITION saying no retained state is held", err)
	}
}

// reportedIs checks what reported makes of a report when on sb at now: the
// error code (none: code ""), the events it appends, and that the table
// takes each of them in turn.
func reportedIs(t *testing.T, sb *Sandbox, when []events.Event, now time.Time, code events.Code, then []events.Event) {
	t.Helper()
	got, err := reported(sb, when, now)
	if got := events.CodeOf(err); got != code {
		t.Fatalf("error %v (code %q), want code %q", err, got, code)
	}
	if !reflect.DeepEqual(got, then) && (len(got) != 0 || len(then) != 0) {
		t.Fatalf("appends %#v, want %#v", got, then)
	}
	phase := sb.Phase
	for _, e := range got {
		next, err := Next(phase, e.Type())
		if err != nil {
			t.Fatalf("reported %s that the table refuses: %v", e.Type(), err)
		}
		phase = next
	}
}
