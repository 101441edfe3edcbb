package gateway

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// contractEvents is the lifecycle by event as CONTRACT §1 states it, written
// out here by hand (never derived from Table), with the additions the README
// documents under "Choices where the contract is silent". Every pair of
// (phase, event type) not listed is refused.
var contractEvents = []struct {
	from events.Phase
	on   string
	to   events.Phase
}{
	// (none) — create accepted → provisioning
	{"", "sandbox.created", "provisioning"},
	// provisioning, starting — supervisor of the current generation attached → ready
	{"provisioning", "supervisor.attached", "ready"},
	{"starting", "supervisor.attached", "ready"},
	// ready — supervisor detached → provisioning
	{"ready", "supervisor.detached", "provisioning"},
	// ready — stop → stopping; stopping — confirmed → stopped; rejected → ready
	{"ready", "sandbox.stop_requested", "stopping"},
	{"stopping", "sandbox.stopped", "stopped"},
	{"stopping", "sandbox.stop_rejected", "ready"},
	// stopped — start → starting (cold)
	{"stopped", "sandbox.start_requested", "starting"},
	// ready — suspend → suspending; → suspended (restore ref) or ready (rejected)
	{"ready", "sandbox.suspend_requested", "suspending"},
	{"suspending", "sandbox.suspended", "suspended"},
	{"suspending", "sandbox.suspend_rejected", "ready"},
	// suspending — deadline: the suspension is cancelled: ready
	// (DeadlineExceeded) if the workload is confirmed running (the rejection
	// first, the passed deadline a fact of ready), else error
	{"suspending", "sandbox.deadline_passed", "error"},
	{"ready", "sandbox.deadline_passed", "ready"},
	// suspended — resume → starting (resume); explicit start → starting (cold),
	// the retained state discarded in the same append
	{"suspended", "sandbox.resume_requested", "starting"},
	{"suspended", "sandbox.start_requested", "starting"},
	{"starting", "sandbox.retained_state_discarded", "starting"},
	// starting (resume): the consumption is the point of no return; the restore
	// is recorded (ready comes with the attach); a failure before consumption
	// → suspended; after it: cold start (fallback) or stopped (RetainedStateLost)
	{"starting", "sandbox.retained_state_consumed", "starting"},
	{"starting", "sandbox.resumed", "starting"},
	{"starting", "sandbox.resume_failed", "suspended"},
	// starting (resume) — deadline before the consumption: suspended
	// (retryable, DeadlineExceeded): the failure first, the deadline a fact
	{"suspended", "sandbox.deadline_passed", "suspended"},
	{"starting", "sandbox.start_requested", "starting"},
	{"starting", "sandbox.stopped", "stopped"},
	// the resumed generation's attach may come before the saga's record of the
	// restore, which is then accepted as a fact in ready, or in suspending
	// when a suspend came in between
	{"ready", "sandbox.resumed", "ready"},
	{"suspending", "sandbox.resumed", "suspending"},
	// the driver's answer to a start is a fact; ready comes with the attach
	{"provisioning", "sandbox.started", "provisioning"},
	{"starting", "sandbox.started", "starting"},
	{"ready", "sandbox.started", "ready"},
	// sandbox.start_failed (an addition): the driver could not start → error
	{"provisioning", "sandbox.start_failed", "error"},
	{"starting", "sandbox.start_failed", "error"},
	// provisioning, ready, starting, suspending — main process exits → error
	{"provisioning", "sandbox.exited", "error"},
	{"ready", "sandbox.exited", "error"},
	{"starting", "sandbox.exited", "error"},
	{"suspending", "sandbox.exited", "error"},
	// stopping — the workload's exit on the way to stopped is a fact
	{"stopping", "sandbox.exited", "stopping"},
	// suspended — the retained workload of the current generation dies: error,
	// the retained state invalidated in the same append
	{"suspended", "sandbox.exited", "error"},
	{"error", "sandbox.retained_state_invalidated", "error"},
	// provisioning, starting — deadline with no supervisor attached → error;
	// every transient phase has a deadline (invariant 5): stopping and
	// deleting end in error too
	{"provisioning", "sandbox.deadline_passed", "error"},
	{"starting", "sandbox.deadline_passed", "error"},
	{"stopping", "sandbox.deadline_passed", "error"},
	{"deleting", "sandbox.deadline_passed", "error"},
	// error — the driver is told to clean up after such a deadline, an
	// intent appended with it, until it confirms (issue 24, hole 7): facts
	{"error", "sandbox.cleanup_requested", "error"},
	{"error", "sandbox.cleaned_up", "error"},
	// stopping, stopped, starting, suspending, suspended — resource lost → error
	{"stopping", "sandbox.resource_lost", "error"},
	{"stopped", "sandbox.resource_lost", "error"},
	{"starting", "sandbox.resource_lost", "error"},
	{"suspending", "sandbox.resource_lost", "error"},
	{"suspended", "sandbox.resource_lost", "error"},
	// any but deleted — delete → deleting → deleted, references invalidated
	{"provisioning", "sandbox.delete_requested", "deleting"},
	{"ready", "sandbox.delete_requested", "deleting"},
	{"stopping", "sandbox.delete_requested", "deleting"},
	{"stopped", "sandbox.delete_requested", "deleting"},
	{"starting", "sandbox.delete_requested", "deleting"},
	{"suspending", "sandbox.delete_requested", "deleting"},
	{"suspended", "sandbox.delete_requested", "deleting"},
	{"error", "sandbox.delete_requested", "deleting"},
	{"deleting", "sandbox.retained_state_invalidated", "deleting"},
	{"deleting", "sandbox.deleted", "deleted"},
	// a forward (CONTRACT §5) is opened to a sandbox that is ready, or
	// suspended (its connections then wait for the resume), and closed in
	// any phase but deleted (a delete closes them all): facts, no phase moves
	{"ready", "sandbox.forward_opened", "ready"},
	{"suspended", "sandbox.forward_opened", "suspended"},
	{"provisioning", "sandbox.forward_closed", "provisioning"},
	{"ready", "sandbox.forward_closed", "ready"},
	{"stopping", "sandbox.forward_closed", "stopping"},
	{"stopped", "sandbox.forward_closed", "stopped"},
	{"starting", "sandbox.forward_closed", "starting"},
	{"suspending", "sandbox.forward_closed", "suspending"},
	{"suspended", "sandbox.forward_closed", "suspended"},
	{"deleting", "sandbox.forward_closed", "deleting"},
	{"error", "sandbox.forward_closed", "error"},
	// Issue 27: an expiry is a fact of the phase it finds (but deleting);
	// an expiry's invalidation of the retained state stops a suspended
	// sandbox.
	{"provisioning", "sandbox.expired", "provisioning"},
	{"ready", "sandbox.expired", "ready"},
	{"stopping", "sandbox.expired", "stopping"},
	{"stopped", "sandbox.expired", "stopped"},
	{"starting", "sandbox.expired", "starting"},
	{"suspending", "sandbox.expired", "suspending"},
	{"suspended", "sandbox.expired", "suspended"},
	{"error", "sandbox.expired", "error"},
	{"suspended", "sandbox.retained_state_invalidated", "stopped"},
	// activity (README "Activity") is a fact of every phase a sandbox can
	// be active in: not deleting (on its way out) nor the terminal ones
	{"provisioning", "sandbox.active", "provisioning"},
	{"ready", "sandbox.active", "ready"},
	{"stopping", "sandbox.active", "stopping"},
	{"stopped", "sandbox.active", "stopped"},
	{"starting", "sandbox.active", "starting"},
	{"suspending", "sandbox.active", "suspending"},
	{"suspended", "sandbox.active", "suspended"},
	// an idle timeout (README "Idle and wake") is a fact of ready only
	{"ready", "sandbox.idle_timeout", "ready"},
	// issue 29: the retained state exported ahead is a fact of suspended
	{"suspended", "sandbox.retained_state_exported", "suspended"},
}

// transitionKey is one (phase, event type) pair of the lifecycle.
type transitionKey struct {
	from events.Phase
	on   string
}

// TestNextWalksEveryPair walks every (phase, event type) pair: the pairs of
// contractEvents succeed with their target, every other pair is refused with
// a *TransitionError that maps to FAILED_PRECONDITION. A row of Table that
// differs from the contract's fails here.
func TestNextWalksEveryPair(t *testing.T) {
	want := map[transitionKey]events.Phase{}
	for _, row := range contractEvents {
		k := transitionKey{row.from, row.on}
		if _, dup := want[k]; dup {
			t.Fatalf("contractEvents lists (%q, %s) twice", row.from, row.on)
		}
		want[k] = row.to
	}
	phases := append([]events.Phase{events.PhaseNone}, events.Phases...)
	types := append(events.Types(), "sandbox.from_the_future")
	allowed := 0
	for _, from := range phases {
		for _, on := range types {
			got, err := Next(from, on)
			if to, ok := want[transitionKey{from, on}]; ok {
				allowed++
				if err != nil || got != to {
					t.Errorf("Next(%q, %s) = %q, %v; the contract says %q", from, on, got, err, to)
				}
				continue
			}
			var te *TransitionError
			if !errors.As(err, &te) {
				t.Errorf("Next(%q, %s) = %q, %v; the contract refuses it", from, on, got, err)
				continue
			}
			if code := events.CodeOf(err); code != events.CodeFailedPrecondition {
				t.Errorf("Next(%q, %s): code %s, want FAILED_PRECONDITION", from, on, code)
			}
		}
	}
	if allowed != len(contractEvents) {
		t.Errorf("walked %d allowed pairs, the contract lists %d (a row names an unregistered type or phase?)", allowed, len(contractEvents))
	}
}

// either, yes and no say which value of a fact an expected command outcome
// is for.
type tri int

const (
	either tri = iota
	yes
	no
)

func (v tri) matches(b bool) bool { return v == either || (v == yes) == b }

// contractCommands is what each command does in each phase, as CONTRACT §1
// and §2 state it (idempotent repeats, UNIMPLEMENTED without the capability,
// FAILED_PRECONDITION in a wrong phase), written out by hand: emit lists the
// events appended, code the error; neither means an idempotent repeat. Every
// (phase, verb) not listed is FAILED_PRECONDITION.
var contractCommands = []struct {
	phase       events.Phase
	verb        string
	afterResume tri
	canSuspend  tri
	holds       tri
	forwarded   tri
	recent      tri
	emit        []string
	code        events.Code
}{
	{phase: "", verb: "create", emit: []string{"sandbox.created"}},
	{phase: "", verb: "start", code: events.CodeNotFound},
	{phase: "", verb: "stop", code: events.CodeNotFound},
	{phase: "", verb: "suspend", code: events.CodeNotFound},
	{phase: "", verb: "resume", code: events.CodeNotFound},
	{phase: "", verb: "delete", code: events.CodeNotFound},
	// create names a new id: an existing one is ALREADY_EXISTS in any phase
	{phase: "provisioning", verb: "create", code: events.CodeAlreadyExists},
	{phase: "ready", verb: "create", code: events.CodeAlreadyExists},
	{phase: "stopping", verb: "create", code: events.CodeAlreadyExists},
	{phase: "stopped", verb: "create", code: events.CodeAlreadyExists},
	{phase: "starting", verb: "create", code: events.CodeAlreadyExists},
	{phase: "suspending", verb: "create", code: events.CodeAlreadyExists},
	{phase: "suspended", verb: "create", code: events.CodeAlreadyExists},
	{phase: "deleting", verb: "create", code: events.CodeAlreadyExists},
	{phase: "deleted", verb: "create", code: events.CodeAlreadyExists},
	{phase: "error", verb: "create", code: events.CodeAlreadyExists},
	// stopped — start → starting (cold); suspended — start discards the
	// retained state first; start on ready is done (and on starting cold);
	// on starting while a resume is under way it is ABORTED (issue 24 #8:
	// the resume may fail back to suspended, and the start would be lost)
	{phase: "stopped", verb: "start", emit: []string{"sandbox.start_requested"}},
	{phase: "suspended", verb: "start", emit: []string{"sandbox.start_requested", "sandbox.retained_state_discarded"}},
	{phase: "ready", verb: "start"},
	{phase: "starting", verb: "start", afterResume: no},
	{phase: "starting", verb: "start", afterResume: yes, code: events.CodeAborted},
	// ready — stop → stopping; stop on stopped is done (and on stopping)
	{phase: "ready", verb: "stop", emit: []string{"sandbox.stop_requested"}},
	{phase: "stopping", verb: "stop"},
	{phase: "stopped", verb: "stop"},
	// ready — suspend (driver capable) → suspending; suspend on suspended is
	// done (and on suspending); a driver without it answers UNIMPLEMENTED
	{phase: "ready", verb: "suspend", canSuspend: yes, emit: []string{"sandbox.suspend_requested"}},
	{phase: "suspending", verb: "suspend"},
	{phase: "suspended", verb: "suspend"},
	{phase: "provisioning", verb: "suspend", canSuspend: no, code: events.CodeUnimplemented},
	{phase: "ready", verb: "suspend", canSuspend: no, code: events.CodeUnimplemented},
	{phase: "stopping", verb: "suspend", canSuspend: no, code: events.CodeUnimplemented},
	{phase: "stopped", verb: "suspend", canSuspend: no, code: events.CodeUnimplemented},
	{phase: "starting", verb: "suspend", canSuspend: no, code: events.CodeUnimplemented},
	{phase: "deleting", verb: "suspend", canSuspend: no, code: events.CodeUnimplemented},
	{phase: "deleted", verb: "suspend", canSuspend: no, code: events.CodeUnimplemented},
	{phase: "error", verb: "suspend", canSuspend: no, code: events.CodeUnimplemented},
	// suspended — resume → starting (resume); resume on ready after a resume
	// is done (and on starting while it runs)
	{phase: "suspended", verb: "resume", holds: yes, emit: []string{"sandbox.resume_requested"}},
	// a consumed reference is never resumed (invariant 1)
	{phase: "suspended", verb: "resume", holds: no, code: events.CodeFailedPrecondition},
	{phase: "ready", verb: "resume", afterResume: yes},
	{phase: "starting", verb: "resume", afterResume: yes},
	// any but deleted — delete → deleting; deleting and deleted are done
	{phase: "provisioning", verb: "delete", emit: []string{"sandbox.delete_requested"}},
	{phase: "ready", verb: "delete", emit: []string{"sandbox.delete_requested"}},
	{phase: "stopping", verb: "delete", emit: []string{"sandbox.delete_requested"}},
	{phase: "stopped", verb: "delete", emit: []string{"sandbox.delete_requested"}},
	{phase: "starting", verb: "delete", emit: []string{"sandbox.delete_requested"}},
	{phase: "suspending", verb: "delete", emit: []string{"sandbox.delete_requested"}},
	{phase: "suspended", verb: "delete", emit: []string{"sandbox.delete_requested"}},
	{phase: "error", verb: "delete", emit: []string{"sandbox.delete_requested"}},
	{phase: "deleting", verb: "delete"},
	{phase: "deleted", verb: "delete"},
	// a forward opens to a ready or suspended sandbox; an unforward closes
	// a forward the sandbox has (NOT_FOUND otherwise), in any phase
	{phase: "", verb: "forward", code: events.CodeNotFound},
	{phase: "", verb: "unforward", code: events.CodeNotFound},
	{phase: "ready", verb: "forward", emit: []string{"sandbox.forward_opened"}},
	{phase: "suspended", verb: "forward", emit: []string{"sandbox.forward_opened"}},
	{phase: "provisioning", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "ready", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "stopping", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "stopped", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "starting", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "suspending", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "suspended", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "deleting", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "error", verb: "unforward", forwarded: yes, emit: []string{"sandbox.forward_closed"}},
	{phase: "provisioning", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "ready", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "stopping", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "stopped", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "starting", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "suspending", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "suspended", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "deleting", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "error", verb: "unforward", forwarded: no, code: events.CodeNotFound},
	{phase: "deleted", verb: "unforward", code: events.CodeNotFound},
	// a touch (README "Activity") records a sandbox.active in every phase
	// a sandbox can be active in, unless one was recorded within the
	// window (then it is done); deleting and the terminal phases refuse it
	{phase: "", verb: "touch", code: events.CodeNotFound},
	{phase: "provisioning", verb: "touch", recent: no, emit: []string{"sandbox.active"}},
	{phase: "ready", verb: "touch", recent: no, emit: []string{"sandbox.active"}},
	{phase: "stopping", verb: "touch", recent: no, emit: []string{"sandbox.active"}},
	{phase: "stopped", verb: "touch", recent: no, emit: []string{"sandbox.active"}},
	{phase: "starting", verb: "touch", recent: no, emit: []string{"sandbox.active"}},
	{phase: "suspending", verb: "touch", recent: no, emit: []string{"sandbox.active"}},
	{phase: "suspended", verb: "touch", recent: no, emit: []string{"sandbox.active"}},
	{phase: "provisioning", verb: "touch", recent: yes},
	{phase: "ready", verb: "touch", recent: yes},
	{phase: "stopping", verb: "touch", recent: yes},
	{phase: "stopped", verb: "touch", recent: yes},
	{phase: "starting", verb: "touch", recent: yes},
	{phase: "suspending", verb: "touch", recent: yes},
	{phase: "suspended", verb: "touch", recent: yes},
}

// TestCommandsWalkEveryPair runs decide for every (phase, verb) pair, with
// and without each fact a row may need, against contractCommands. A row of
// Commands that differs from the contract fails here.
func TestCommandsWalkEveryPair(t *testing.T) {
	phases := append([]events.Phase{events.PhaseNone}, events.Phases...)
	for _, phase := range phases {
		for _, verb := range allVerbs {
			for _, f := range allFacts() {
				var matched []int
				for i, w := range contractCommands {
					if w.phase == phase && w.verb == verb && w.afterResume.matches(f.afterResume) &&
						w.canSuspend.matches(f.canSuspend) && w.holds.matches(f.holds) && w.forwarded.matches(f.forwarded) &&
						w.recent.matches(f.recent) {
						matched = append(matched, i)
					}
				}
				if len(matched) > 1 {
					t.Fatalf("contractCommands rows %v all match (%q, %s)", matched, phase, verb)
				}
				var wantEmit []string
				wantCode := events.CodeFailedPrecondition
				if len(matched) == 1 {
					wantEmit, wantCode = contractCommands[matched[0]].emit, contractCommands[matched[0]].code
				}
				s := &Sandbox{ID: sid, Phase: phase, Generation: 4, Resuming: f.afterResume}
				if f.holds {
					s.RestoreRef = "ref-4"
				}
				if f.forwarded {
					s.View.Forwards = []events.Forward{{ID: "fw-1"}}
				}
				now := time.Unix(1000, 0)
				s.Active = now.Add(-time.Minute) // a window ago: not recent
				if f.recent {
					s.Active = now.Add(-time.Minute + time.Millisecond)
				}
				c := Command{Verb: verb, ID: sid, Forward: events.Forward{ID: "fw-1"}, At: now, Window: time.Minute}
				evs, err := decide(s, c, compute.Capabilities{Suspend: f.canSuspend})
				var got []string
				for _, e := range evs {
					got = append(got, e.Type())
				}
				if code := events.CodeOf(err); code != wantCode || !slices.Equal(got, wantEmit) {
					t.Errorf("%s %s %+v: events %v, code %q (%v); the contract says events %v, code %q",
						phase, verb, f, got, code, err, wantEmit, wantCode)
				}
			}
		}
	}
}

// facts are the facts besides the phase a command row may need.
type facts struct{ afterResume, canSuspend, holds, forwarded, recent bool }

// allFacts is every combination of them.
func allFacts() []facts {
	var out []facts
	for i := 0; i < 32; i++ {
		out = append(out, facts{afterResume: i&1 != 0, canSuspend: i&2 != 0, holds: i&4 != 0, forwarded: i&8 != 0, recent: i&16 != 0})
	}
	return out
}

// TestCommandEventsFollowTheTable: what every emitting row appends is a path
// of the event table from its phase.
func TestCommandEventsFollowTheTable(t *testing.T) {
	for _, r := range Commands {
		if r.Then != Emit {
			continue
		}
		froms := []events.Phase{r.Phase}
		if r.Phase == anyPhase {
			froms = events.Phases
		}
		for _, from := range froms {
			if r.Phase == anyPhase && takenAbove(r, from) {
				continue // a row above the catch-all takes this phase
			}
			p := from
			for _, typ := range r.Events {
				next, err := Next(p, typ)
				if err != nil {
					t.Errorf("%s on %s appends %v: %v", r.Verb, from, r.Events, err)
					break
				}
				p = next
			}
		}
	}
}

// takenAbove says whether a row of Commands above r, for r's verb, names
// phase p itself.
func takenAbove(r Rule, p events.Phase) bool {
	for _, above := range Commands {
		if above.Verb == r.Verb && above.Phase == p {
			return true
		}
		if above.Verb == r.Verb && above.Phase == r.Phase && slices.Equal(above.Events, r.Events) && above.Then == r.Then {
			return false
		}
	}
	return false
}

// TestRefusalNamesThePhasesNeeded: a command in a wrong phase says which
// phases it needs, as CONTRACT §2's example message does.
func TestRefusalNamesThePhasesNeeded(t *testing.T) {
	for _, c := range []struct {
		phase events.Phase
		verb  string
		want  string
	}{
		{phStopped, VerbResume, "is stopped; resume needs suspended"},
		{phProvisioning, VerbStart, "is provisioning; start needs stopped or suspended"},
		{phSuspended, VerbStop, "is suspended; stop needs ready"},
		{phStopped, VerbSuspend, "is stopped; suspend needs ready"},
	} {
		s := &Sandbox{ID: sid, Phase: c.phase, Generation: 1}
		_, err := decide(s, Command{Verb: c.verb, ID: sid}, compute.Capabilities{Suspend: true})
		if events.CodeOf(err) != events.CodeFailedPrecondition || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s on %s: %v; want FAILED_PRECONDITION saying %q", c.verb, c.phase, err, c.want)
		}
	}
}
