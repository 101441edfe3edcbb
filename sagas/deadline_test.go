package sagas_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/storetest"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
)

// short is the deadline of these tests.
const short = 100 * time.Millisecond

func passed(p events.Phase) *events.DeadlinePassed {
	return &events.DeadlinePassed{Phase: p, Deadline: short.String()}
}

// stopAfter is the clean-up a deadline that ended generation gen's phase
// in error asks for: the workload stopped.
func stopAfter(gen int64) *events.CleanupRequested {
	return &events.CleanupRequested{Generation: gen, Action: events.CleanupStop}
}

// TestSuspendDeadline: a suspension that outlives its deadline is settled by
// what the driver observes then.
func TestSuspendDeadline(t *testing.T) {
	code := 9
	cases := []struct {
		name     string
		observed func(ref string) (compute.Observation, error)
		want     []events.Event
	}{
		{"the workload running: ready", nil, []events.Event{
			&events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, passed(events.PhaseSuspending)}},
		{"nothing known: error", func(string) (compute.Observation, error) {
			return compute.Observation{}, errors.New("no idea")
		}, []events.Event{passed(events.PhaseSuspending)}},
		{"frozen after all: suspended", func(string) (compute.Observation, error) {
			return compute.Observation{State: compute.StateFrozen, Generation: 1, RestoreRef: "sim:late"}, nil
		}, []events.Event{&events.Suspended{Generation: 1, RestoreRef: "sim:late"}}},
		{"exited meanwhile: error, the code kept", func(string) (compute.Observation, error) {
			return compute.Observation{State: compute.StateExited, Generation: 1, ExitCode: code}, nil
		}, []events.Event{&events.Exited{Generation: 1, Code: code}}},
		{"gone: error", func(string) (compute.Observation, error) {
			return compute.Observation{State: compute.StateGone}, nil
		}, []events.Event{&events.ResourceLost{Generation: 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, sagas.Config{Deadline: short})
			sb := h.ready(nil)
			drv := newCounting(h.sim, "suspend") // hangs until its deadline
			if c.observed != nil {
				drv.observed = func() (compute.Observation, error) { return c.observed("") }
			}
			h.run(drv)
			in := sb.when(&events.SuspendRequested{Generation: 1})
			got := sb.outcome(in, len(c.want))
			if s, ok := got[0].(*events.Suspended); ok && s.RestoreRef == "sim:late" {
				got[0] = &events.Suspended{Generation: 1, RestoreRef: "sim:" + sb.id + ":late"}
				c.want[0] = &events.Suspended{Generation: 1}
			}
			sb.then(got, c.want...)
			if n := drv.count("observe"); n != 1 {
				t.Errorf("observe calls %d, want 1", n)
			}
		})
	}
}

// TestAttachDeadline: a supervisor that never attaches ends its sandbox in
// error at the deadline (provisioning after a create, starting after a
// start), and the driver is told to stop the workload.
func TestAttachDeadline(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short})
	drv := newCounting(h.sim, "")
	h.run(drv)
	sb, created := h.create(node, map[string]string{"attach": "never"})
	sb.then(sb.outcome(created, 2), &events.Started{Generation: 1}, passed(events.PhaseProvisioning), stopAfter(1))
	h.store.waitUntil(t, "the clean-up stop", func() bool { return drv.count("stop") == 1 })
	if o, _ := h.sim.Observe(context.Background(), compute.Spec{SandboxID: sb.id}); o.State != compute.StateStopped {
		t.Fatalf("after the clean-up the sim observes %+v, want stopped", o)
	}
	// The position moves past the settled phase.
	h.store.waitPast(t, created.Seq)
}

// TestResumeDeadline: a resume that outlives its deadline before the
// retained state was consumed goes back to suspended, retryable.
func TestResumeDeadline(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short})
	sb, ref := h.suspended(nil)
	drv := newCounting(h.sim, "resume") // hangs until its deadline
	h.run(drv)
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.then(sb.outcome(in, 2), &events.ResumeFailed{Generation: 2}, passed(events.PhaseStarting))
	if o, _ := h.sim.Observe(context.Background(), compute.Spec{SandboxID: sb.id}); o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("the sim observes %+v, want the state still held behind %s", o, ref)
	}
}

// TestResumeDeadlineLostAnswer (issue 24, hole 2): a resume whose answer
// is lost goes back to suspended at its deadline only when the driver says
// the state is still held behind the reference; a consumption it observes
// (the restore failed after it) takes the path after the consumption, an
// exit of the resumed generation is recorded with its code, and a driver
// that cannot tell proves nothing held: error, never suspended on a
// reference that may be consumed.
func TestResumeDeadlineLostAnswer(t *testing.T) {
	consumed := func(ref string) *events.RetainedStateConsumed {
		return &events.RetainedStateConsumed{Generation: 2, RestoreRef: ref}
	}
	cases := []struct {
		name     string
		resume   string
		observed func() (compute.Observation, error)
		want     func(ref string) []events.Event
	}{
		{"consumed, the restore failed: error", "fail_after_consume", nil, func(ref string) []events.Event {
			return []events.Event{consumed(ref), passed(events.PhaseStarting), stopAfter(2)}
		}},
		{"failed before consuming, the state held: suspended", "fail", nil, func(string) []events.Event {
			return []events.Event{&events.ResumeFailed{Generation: 2}, passed(events.PhaseStarting)}
		}},
		{"nothing known: error", "fail", func() (compute.Observation, error) {
			return compute.Observation{}, errors.New("no idea")
		}, func(string) []events.Event {
			return []events.Event{passed(events.PhaseStarting), stopAfter(2)}
		}},
		{"the resumed generation exited: error, the code kept", "ok", func() (compute.Observation, error) {
			return compute.Observation{State: compute.StateExited, Generation: 2, ExitCode: 5}, nil
		}, func(ref string) []events.Event {
			return []events.Event{consumed(ref), &events.Exited{Generation: 2, Code: 5}}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, sagas.Config{Deadline: short})
			sb, ref := h.suspended(map[string]string{"resume": c.resume, "attach": "never"})
			drv := newCounting(h.sim, "")
			drv.lose = "resume"
			drv.observed = c.observed
			h.run(drv)
			in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
			want := c.want(ref)
			sb.then(sb.outcome(in, len(want)), want...)
		})
	}
}

// TestStartDeadlineObservesAnExit (issue 24, hole 6): a workload that ran
// and exited before its supervisor's attach was taken is, at the
// provisioning or starting deadline, the exit with its code, not a
// deadline with none.
func TestStartDeadlineObservesAnExit(t *testing.T) {
	exited := func(gen int64) func() (compute.Observation, error) {
		return func() (compute.Observation, error) {
			return compute.Observation{State: compute.StateExited, Generation: gen, ExitCode: 3}, nil
		}
	}
	t.Run("provisioning", func(t *testing.T) {
		h := newHarness(t, sagas.Config{Deadline: short})
		drv := newCounting(h.sim, "")
		drv.observed = exited(1)
		h.run(drv)
		sb, created := h.create(node, map[string]string{"attach": "never"})
		sb.then(sb.outcome(created, 2), &events.Started{Generation: 1}, &events.Exited{Generation: 1, Code: 3})
	})
	t.Run("starting", func(t *testing.T) {
		h := newHarness(t, sagas.Config{Deadline: short})
		sb := h.ready(map[string]string{"attach": "never"})
		sb.given(&events.StopRequested{Generation: 1}, &events.Stopped{Generation: 1})
		drv := newCounting(h.sim, "")
		drv.observed = exited(2)
		h.run(drv)
		in := sb.when(&events.StartRequested{Generation: 2})
		sb.then(sb.outcome(in, 2), &events.Started{Generation: 2}, &events.Exited{Generation: 2, Code: 3})
	})
	t.Run("an older generation's exit is no exit of this one", func(t *testing.T) {
		h := newHarness(t, sagas.Config{Deadline: short})
		sb := h.ready(map[string]string{"attach": "never"})
		sb.given(&events.StopRequested{Generation: 1}, &events.Stopped{Generation: 1})
		drv := newCounting(h.sim, "")
		drv.observed = exited(1)
		h.run(drv)
		in := sb.when(&events.StartRequested{Generation: 2})
		sb.then(sb.outcome(in, 2), &events.Started{Generation: 2}, passed(events.PhaseStarting), stopAfter(2))
	})
}

// TestStopDeadline: a stop with no answer by its deadline, the workload
// observed running, goes back to ready; observed stopped, it is stopped.
func TestStopDeadline(t *testing.T) {
	t.Run("running", func(t *testing.T) {
		h := newHarness(t, sagas.Config{Deadline: short})
		sb := h.ready(nil)
		drv := newCounting(h.sim, "stop")
		h.run(drv)
		in := sb.when(&events.StopRequested{Generation: 1})
		sb.then(sb.outcome(in, 2), &events.StopRejected{Generation: 1}, passed(events.PhaseStopping))
	})
	t.Run("stopped after all", func(t *testing.T) {
		h := newHarness(t, sagas.Config{Deadline: short})
		sb := h.ready(nil)
		drv := newCounting(h.sim, "stop")
		drv.observed = func() (compute.Observation, error) {
			return compute.Observation{State: compute.StateStopped, Generation: 1}, nil
		}
		h.run(drv)
		in := sb.when(&events.StopRequested{Generation: 1})
		sb.then(sb.outcome(in, 1), &events.Stopped{Generation: 1})
	})
}

// TestDeleteDeadline: a delete whose driver never answers ends in error at
// its deadline, and the driver is told to delete once more; one whose driver
// holds nothing any more is deleted.
func TestDeleteDeadline(t *testing.T) {
	t.Run("still there", func(t *testing.T) {
		h := newHarness(t, sagas.Config{Deadline: short})
		sb := h.ready(nil)
		drv := newCounting(h.sim, "delete")
		h.run(drv)
		in := sb.when(&events.DeleteRequested{})
		sb.then(sb.outcome(in, 1), passed(events.PhaseDeleting), &events.CleanupRequested{Generation: 1, Action: events.CleanupDelete})
		// In error, the driver is told again to delete what it holds.
		h.store.waitUntil(t, "the clean-up delete", func() bool { return drv.count("delete") >= 2 })
	})
	t.Run("gone", func(t *testing.T) {
		h := newHarness(t, sagas.Config{Deadline: short})
		sb, ref := h.suspended(nil)
		drv := newCounting(h.sim, "delete")
		drv.observed = func() (compute.Observation, error) { return compute.Observation{State: compute.StateGone}, nil }
		h.run(drv)
		in := sb.when(&events.DeleteRequested{})
		sb.then(sb.outcome(in, 2), &events.RetainedStateInvalidated{RestoreRef: ref}, &events.Deleted{})
	})
}

// TestUnansweredCallsAreRepeated: a driver call that gets no answer is no
// rejection: it is made again until the driver answers.
func TestUnansweredCallsAreRepeated(t *testing.T) {
	for _, c := range []struct {
		verb string
		in   events.Event
		want events.Event
	}{
		{"suspend", &events.SuspendRequested{Generation: 1}, &events.Suspended{Generation: 1}},
		{"stop", &events.StopRequested{Generation: 1}, &events.Stopped{Generation: 1}},
	} {
		t.Run(c.verb, func(t *testing.T) {
			h := newHarness(t, sagas.Config{})
			sb := h.ready(nil)
			drv := newCounting(h.sim, "")
			drv.unavailable = 2
			h.run(drv)
			in := sb.when(c.in)
			sb.then(sb.outcome(in, 1), c.want)
			if n := drv.count(c.verb); n != 3 {
				t.Fatalf("%s calls %d, want 3 (two unanswered, then the answer)", c.verb, n)
			}
		})
	}
}

// TestDeadlineAcrossDowntime: the runner stops while a sandbox waits for
// its supervisor; its position stays before the phase's start, so a runner
// started later, its deadline passed meanwhile, reads it again and settles
// it (after the grace an attach retried across the restart would get).
func TestDeadlineAcrossDowntime(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: time.Hour})
	drv := newCounting(h.sim, "")
	stop := h.run(drv)
	sb, created := h.create(node, map[string]string{"attach": "never"})
	sb.then(sb.outcome(created, 1), &events.Started{Generation: 1})
	stop()
	if got := h.store.saved(); got >= created.Seq {
		t.Fatalf("position saved at %d, past the open provisioning entered at %d", got, created.Seq)
	}
	// Started again with a deadline that has passed since the create.
	h.cfg = sagas.Config{Node: node, Deadline: time.Millisecond, Grace: 20 * time.Millisecond, CheckpointEvery: time.Millisecond}
	h.run(drv)
	sb.then(sb.outcome(created, 2), &events.Started{Generation: 1}, &events.DeadlinePassed{Phase: events.PhaseProvisioning, Deadline: "1ms"}, stopAfter(1))
	if n := drv.count("start"); n != 1 {
		t.Errorf("start calls %d, want 1: the settled create is not driven again", n)
	}
}

// TestForgedEventsKeepTheDeadline: events the lifecycle table refuses,
// appended on the subject of a sandbox whose stop hangs and stamped with
// phases that would end it (suspended, deleted, a bogus one, an intent
// whose data is not an object), neither disarm the stop's deadline nor
// drive a step: the deadline settles the stop as if they were not there,
// and the runner counts each.
func TestForgedEventsKeepTheDeadline(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short})
	sb := h.ready(nil)
	drv := newCounting(h.sim, "stop")
	r, _ := h.start(drv)
	in := sb.when(&events.StopRequested{Generation: 1})
	ctx := context.Background()
	forged := storetest.ForgedStopping(sb.id, 1, time.Now())
	// The forged exit is stamped error: the table takes it in stopping as
	// a fact, and the checker says its stamp lies.
	h.expect(func(v check.Violation) bool {
		return v.Rule == check.RuleStamp && strings.Contains(v.Message, events.TypeExited)
	})
	for _, f := range forged {
		head, err := h.store.Head(ctx, sb.id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.store.Append(ctx, sb.id, head, f); err != nil {
			t.Fatalf("append forged %s: %v", f.Type, err)
		}
	}
	sb.then(sb.outcome(in, 2), &events.StopRejected{Generation: 1}, passed(events.PhaseStopping))
	// All but the exit, which the table takes in stopping as a fact.
	if got, want := r.Refused(), uint64(len(forged)-1); got != want {
		t.Errorf("Refused = %d, want %d", got, want)
	}
	if n := drv.total(); n != drv.count("stop")+drv.count("observe") {
		t.Errorf("driver calls %v: a forged intent drove a step", drv.calls)
	}
}

// TestDeadlineDoesNotWaitBehindSlowSteps (issue 24, hole 10): with every
// worker slot held by a step whose driver call does not return (a
// suspend of another sandbox, stuck in its driver), a passed deadline is
// still settled: deadlines have a lane of their own. The order is the
// assertion: the provisioning deadline of one sandbox is recorded while
// the other's suspend is still held in its driver (released only once the
// deadline is in the log), so no clock speed is assumed.
func TestDeadlineDoesNotWaitBehindSlowSteps(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short, Workers: 1})
	drv := newCounting(h.sim, "stop")
	drv.stubborn = true
	// Laid before the runner starts: laid while it ran, its create was
	// answered twice at times (the runner's started and the harness's).
	slow := h.ready(nil)
	h.run(drv)
	t.Cleanup(func() { close(drv.release) }) // before the runner stops
	never, created := h.create(node, map[string]string{"attach": "never"})
	never.then(never.outcome(created, 1), &events.Started{Generation: 1})
	stop := slow.when(&events.StopRequested{Generation: 1})
	select {
	case <-drv.entered: // the only worker slot is held in the driver
	case <-time.After(wait):
		t.Fatal("the stop never reached the driver")
	}
	never.then(never.outcome(created, 2), &events.Started{Generation: 1}, passed(events.PhaseProvisioning), stopAfter(1))
	if n := len(slow.causedBy(stop)); n != 0 {
		t.Fatalf("the held stop has %d outcome events, want none while it is held", n)
	}
}

// observed is what the sim observes of sb's workload now.
func (sb *sandbox) observed() compute.Observation {
	sb.h.t.Helper()
	o, err := sb.h.sim.Observe(context.Background(), compute.Spec{SandboxID: sb.id})
	if err != nil {
		sb.h.t.Fatal(err)
	}
	return o
}

// cleanedUp waits until sb's log confirms the clean-up it asked for (a
// cleanup_requested, then the cleaned_up it caused) and checks what it
// says.
func (sb *sandbox) cleanedUp(want *events.CleanedUp) {
	sb.h.t.Helper()
	var got []events.Event
	sb.h.store.waitUntil(sb.h.t, "the confirmed clean-up in the log", func() bool {
		all, err := sb.h.store.Load(context.Background(), sb.id, 0)
		if err != nil {
			sb.h.t.Fatal(err)
		}
		for _, asked := range all {
			if asked.Type != events.TypeCleanupRequested {
				continue
			}
			got = nil
			for _, e := range all {
				if e.CausationID == asked.ID {
					d, err := e.Decode()
					if err != nil {
						sb.h.t.Fatal(err)
					}
					got = append(got, d)
				}
			}
		}
		return len(got) > 0
	})
	sb.then(got, want)
}

// TestDeadlineCleanupOutlivesAnUnreachableDriver (issue 24, hole 7): the
// driver is cut off when a provisioning deadline passes; the clean-up it
// asks for is called again until the driver, reachable again, confirms it:
// the workload that never attached is stopped, and the log says so. It
// used to be called once and forgotten: the workload ran on behind error.
func TestDeadlineCleanupOutlivesAnUnreachableDriver(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short})
	drv := newCounting(h.sim, "")
	drv.notify = h.store.notify
	h.run(drv)
	sb, created := h.create(node, map[string]string{"attach": "never"})
	sb.then(sb.outcome(created, 1), &events.Started{Generation: 1})
	drv.setUnreachable(true)
	got := sb.outcome(created, 2)
	sb.then(got, &events.Started{Generation: 1}, passed(events.PhaseProvisioning), stopAfter(1))
	h.store.waitUntil(t, "the clean-up called again while the driver is cut off", func() bool { return drv.count("stop") >= 2 })
	if o := sb.observed(); o.State != compute.StateRunning {
		t.Fatalf("while the driver is cut off the sim observes %+v, want the workload still running", o)
	}
	drv.setUnreachable(false)
	h.store.waitUntil(t, "the workload stopped", func() bool { return sb.observed().State == compute.StateStopped })
	sb.cleanedUp(&events.CleanedUp{Generation: 1, Action: events.CleanupStop})
}

// TestDeadlineCleanupAcrossARestart (issue 24, hole 7): the runner stops
// while the clean-up of a passed deadline is in the driver, unanswered; a
// runner started later drives it again from the log, and the workload is
// stopped. It used to be lost with the runner that had it in hand.
func TestDeadlineCleanupAcrossARestart(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short})
	first := newCounting(h.sim, "stop") // the clean-up hangs in the driver
	stop := h.run(first)
	sb, created := h.create(node, map[string]string{"attach": "never"})
	sb.then(sb.outcome(created, 2), &events.Started{Generation: 1}, passed(events.PhaseProvisioning), stopAfter(1))
	select {
	case <-first.entered:
	case <-time.After(wait):
		t.Fatal("the clean-up never reached the driver")
	}
	stop()
	if o := sb.observed(); o.State != compute.StateRunning {
		t.Fatalf("after the first runner the sim observes %+v, want the workload still running", o)
	}
	second := newCounting(h.sim, "")
	second.notify = h.store.notify
	h.run(second)
	h.store.waitUntil(t, "the workload stopped", func() bool { return sb.observed().State == compute.StateStopped })
	sb.cleanedUp(&events.CleanedUp{Generation: 1, Action: events.CleanupStop})
	if n := second.count("stop"); n != 1 {
		t.Errorf("stop calls of the second runner %d, want 1", n)
	}
}

// TestLateSuspendAnswerAfterTheDeadline (issue 24, hole 9): a suspend
// whose driver answers only after the phase's deadline settled it back to
// ready (the workload was observed running then; the suspension happened
// after, as a remote node that took the call late does it) is not left
// frozen behind the ready view: the late reference is released by
// resuming it in place, under the same generation, and the workload runs
// again. The fake driver answers when the test lets it, after the
// deadline's outcome is in the log, whatever its call's context says.
func TestLateSuspendAnswerAfterTheDeadline(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short})
	sb := h.ready(nil)
	drv := newCounting(h.sim, "suspend")
	drv.stubborn = true
	drv.notify = h.store.notify
	h.run(drv)
	var once sync.Once
	release := func() { once.Do(func() { close(drv.release) }) }
	t.Cleanup(release) // before the runner stops
	in := sb.when(&events.SuspendRequested{Generation: 1})
	sb.then(sb.outcome(in, 2), &events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, passed(events.PhaseSuspending))
	release() // the suspension happens now, and its answer comes
	h.store.waitUntil(t, "the late reference released, the workload running", func() bool {
		return drv.count("resume")+drv.count("discard") > 0 && sb.observed().State == compute.StateRunning
	})
	if o := sb.observed(); o.Generation != 1 || o.RestoreRef != "" {
		t.Fatalf("after the late answer the sim observes %+v, want generation 1 running, nothing retained", o)
	}
	all, err := h.store.Load(context.Background(), sb.id, 0)
	if err != nil {
		t.Fatal(err)
	}
	var v events.View
	for _, env := range all {
		v.Fold(env)
	}
	if v.Phase != events.PhaseReady || v.Generation != 1 || v.Restore.Held {
		t.Fatalf("the view after the late answer: %+v, want ready at generation 1, nothing held", v)
	}
}

// TestDeadlineDoesNotWaitBehindItsOwnQueuedStep (issue 24, hole 10): a
// sandbox's step that waits for a worker slot, every slot held by a step
// stuck in its driver, does not hold up that sandbox's own passed
// deadline: the deadline is settled while the slot is still held, and the
// step, once it runs, finds its intent settled.
func TestDeadlineDoesNotWaitBehindItsOwnQueuedStep(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short, Workers: 1})
	drv := newCounting(h.sim, "stop")
	drv.stubborn = true
	slow := h.ready(nil) // before the runner starts, as in TestDeadlineDoesNotWaitBehindSlowSteps
	h.run(drv)
	t.Cleanup(func() { close(drv.release) }) // before the runner stops
	stop := slow.when(&events.StopRequested{Generation: 1})
	select {
	case <-drv.entered: // the only worker slot is held in the driver
	case <-time.After(wait):
		t.Fatal("the stop never reached the driver")
	}
	sb := h.ready(nil)
	in := sb.when(&events.SuspendRequested{Generation: 1}) // its step waits for the slot
	sb.then(sb.outcome(in, 2), &events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, passed(events.PhaseSuspending))
	if n := len(slow.causedBy(stop)); n != 0 {
		t.Fatalf("the held stop has %d outcome events, want none while it is held", n)
	}
	if n := drv.count("suspend"); n != 0 {
		t.Errorf("suspend calls %d while the slot is held, want none", n)
	}
}

// TestLateSuspendAnswerThatCannotBeResumedInPlace (issue 24, hole 9): when
// the late reference cannot be resumed in place (the sim's restore fails),
// it is discarded, and the view does not stay ready over the workload the
// discard ended: the supervisor is recorded detached, and the provisioning
// deadline then ends the sandbox in error.
func TestLateSuspendAnswerThatCannotBeResumedInPlace(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: short})
	sb := h.ready(map[string]string{"resume": "fail"})
	drv := newCounting(h.sim, "suspend")
	drv.stubborn = true
	h.run(drv)
	var once sync.Once
	release := func() { once.Do(func() { close(drv.release) }) }
	t.Cleanup(release) // before the runner stops
	in := sb.when(&events.SuspendRequested{Generation: 1})
	sb.then(sb.outcome(in, 2), &events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, passed(events.PhaseSuspending))
	release()
	got := sb.outcome(in, 3)
	sb.then(got, &events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, passed(events.PhaseSuspending),
		&events.SupervisorDetached{Generation: 1})
	if n := drv.count("discard"); n != 1 {
		t.Errorf("discard calls %d, want 1", n)
	}
	if o := sb.observed(); o.State == compute.StateFrozen || o.State == compute.StateRunning {
		t.Fatalf("after the discard the sim observes %+v, want nothing frozen or running", o)
	}
}

// TestStepBackingOffLeavesItsSlot (issue 24, hole 10): a step whose driver
// gets no answer calls again after a backoff until its deadline (a
// minute here); while it backs off it holds no worker slot, so another
// sandbox's stop, with the only slot, runs meanwhile. It used to wait for
// the whole minute.
func TestStepBackingOffLeavesItsSlot(t *testing.T) {
	h := newHarness(t, sagas.Config{Deadline: time.Minute, Workers: 1})
	drv := newCounting(h.sim, "")
	drv.mute = "suspend" // unanswered, for as long as the test runs
	drv.notify = h.store.notify
	slow := h.ready(nil)
	other := h.ready(nil)
	h.run(drv)
	suspend := slow.when(&events.SuspendRequested{Generation: 1})
	h.store.waitUntil(t, "the suspend called again", func() bool { return drv.count("suspend") >= 2 })
	in := other.when(&events.StopRequested{Generation: 1})
	other.then(other.outcome(in, 1), &events.Stopped{Generation: 1})
	if n := len(slow.causedBy(suspend)); n != 0 {
		t.Fatalf("the suspend has %d outcome events, want none: it backs off until its deadline", n)
	}
}

// TestDeadlineExtendedForOutages: a deadline that passes while the log was
// unavailable within it (Config.Unavailable) is extended by that outage,
// once for each outage, and the deadline_passed recorded at last says by
// how much; an outage before the phase was entered extends nothing.
func TestDeadlineExtendedForOutages(t *testing.T) {
	const outage = 30 * time.Millisecond
	cases := []struct {
		name string
		// down is the outage Unavailable reports since a time.
		down     func(since time.Time) time.Duration
		extended string
	}{
		{"no outage", func(time.Time) time.Duration { return 0 }, ""},
		{"an outage within the deadline", func(time.Time) time.Duration { return outage }, outage.String()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			var asked []time.Time
			down := func(since time.Time) time.Duration {
				mu.Lock()
				asked = append(asked, since)
				mu.Unlock()
				return c.down(since)
			}
			h := newHarness(t, sagas.Config{Deadline: short, Unavailable: down})
			sb := h.ready(nil)
			drv := newCounting(h.sim, "suspend") // hangs until its deadline
			h.run(drv)
			in := sb.when(&events.SuspendRequested{Generation: 1})
			got := sb.outcome(in, 2)
			p := &events.DeadlinePassed{Phase: events.PhaseSuspending, Deadline: short.String(), Extended: c.extended}
			sb.then(got, &events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}, p)
			mu.Lock()
			defer mu.Unlock()
			for _, since := range asked {
				if !since.Equal(in.Time) {
					t.Errorf("outages asked since %s, want since the phase was entered, %s", since, in.Time)
				}
			}
		})
	}
}
