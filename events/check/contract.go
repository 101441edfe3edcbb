package check

import (
	"fmt"
	"slices"

	"github.com/torpor/torpor/events"
)

// This file is CONTRACT §1's table of phases, written again from the
// contract's text and not from events.Table, which the gateway decides
// with and the views fold with: the check is an independent judge of
// both. Where the two disagree on a row, the check reports the log's
// event (see TestContractAndTable for the rows where they differ).

// Short names of the phases, for the table below.
const (
	none         = events.PhaseNone
	provisioning = events.PhaseProvisioning
	ready        = events.PhaseReady
	stopping     = events.PhaseStopping
	stopped      = events.PhaseStopped
	starting     = events.PhaseStarting
	suspending   = events.PhaseSuspending
	suspended    = events.PhaseSuspended
	deleting     = events.PhaseDeleting
	deleted      = events.PhaseDeleted
	errored      = events.PhaseError
)

// life is where CONTRACT §1 puts a sandbox, with what its rows read
// besides the phase: which kind of starting it is, whether the retained
// state was consumed, and what the event before settled.
type life struct {
	phase    events.Phase
	resume   bool // starting (resume), else starting (cold)
	consumed bool // starting (resume): the retained state was consumed
	fallback bool // starting (resume): restart_if_restore_fails
	discard  bool // starting (cold) from suspended: the retained state is discarded in the same append
	attached bool // the current generation's supervisor attached
	// settled is the transient phase the event before moved back to ready
	// or suspended (a gentler compensation): a deadline_passed of that
	// phase right after it is the same append's, a fact of the phase.
	settled events.Phase
	// idle is the action of the idle timeout just before (issue 27): the
	// next event must start it, in the same append.
	idle string
}

// next is the phase CONTRACT §1 puts the sandbox in after e, or "" and
// why the contract does not take e in this phase. Generations are not
// its business (the check fences reports apart).
func (l *life) next(e events.Event) (events.Phase, string) {
	p := l.phase
	in := func(ps ...events.Phase) bool { return slices.Contains(ps, p) }
	if l.idle != "" {
		// Issue 27: an idle timeout is followed by the start of its action.
		_, suspend := e.(*events.SuspendRequested)
		_, stop := e.(*events.StopRequested)
		if (l.idle == events.IdleSuspend && !suspend) || (l.idle == events.IdleStop && !stop) {
			return "", fmt.Sprintf("an idle timeout whose action is %s followed by no %s_requested", l.idle, l.idle)
		}
	}
	switch e := e.(type) {
	case *events.Created:
		if p == none {
			return provisioning, ""
		}
		return "", "a sandbox is created once"
	case *events.Started:
		// "Events that keep the phase: started (only the attach makes ready)".
		if in(provisioning, starting, ready) {
			return p, ""
		}
	case *events.StartFailed:
		if in(provisioning, starting) {
			return errored, ""
		}
	case *events.SupervisorAttached:
		if in(provisioning, starting) {
			return ready, ""
		}
	case *events.SupervisorDetached:
		if p == ready {
			return provisioning, ""
		}
		return "", "a detach outside ready is refused"
	case *events.StopRequested:
		if p == ready {
			return stopping, ""
		}
	case *events.Stopped:
		switch {
		case p == stopping:
			return stopped, ""
		case p == starting && l.resume && l.consumed && e.Reason == events.ReasonRetainedStateLost:
			return stopped, ""
		case p == starting && l.resume && e.Reason == events.ReasonRetainedStateLost:
			return "", "RetainedStateLost only after the consumption"
		}
	case *events.StopRejected:
		if p == stopping {
			return ready, ""
		}
	case *events.StartRequested:
		switch {
		case in(stopped, suspended):
			return starting, ""
		case p == starting && l.resume && l.consumed && l.fallback && e.Fallback:
			return starting, "" // starting (cold), outcome cold_start_fallback
		case p == starting:
			return "", "a cold start during a start only as the fallback of a consumed resume with restart_if_restore_fails"
		}
	case *events.SuspendRequested:
		if p == ready {
			return suspending, ""
		}
	case *events.Suspended:
		if p == suspending {
			return suspended, ""
		}
	case *events.SuspendRejected:
		if p == suspending {
			return ready, ""
		}
	case *events.ResumeRequested:
		if p == suspended {
			return starting, ""
		}
	case *events.RetainedStateConsumed:
		if p == starting && l.resume {
			return starting, ""
		}
	case *events.RetainedStateDiscarded:
		if p == starting && l.discard {
			return starting, ""
		}
		return "", "a discard only with the explicit start of a suspended sandbox"
	case *events.RetainedStateInvalidated:
		switch {
		case in(deleting, errored):
			return p, ""
		case p == suspended && e.Reason == events.ReasonExpired:
			// Issue 27: an expiry stops a suspended sandbox, its retained
			// state invalidated: never suspended on it again.
			return stopped, ""
		case p == suspended:
			return "", "an invalidation in suspended only by an expiry"
		}
	case *events.Expired:
		// Issue 27: an expiry is a fact of the phase it finds; the events
		// that carry out its action follow it. A retention expires only a
		// suspended sandbox's state; nothing expires a deleting one.
		switch {
		case e.Policy == events.ExpiryRetention && p != suspended:
			return "", "a retention expiry only in suspended"
		case in(provisioning, ready, stopping, stopped, starting, suspending, suspended, errored):
			return p, ""
		}
	case *events.IdleTimeout:
		// Issue 27: a fact of ready, its action suspend or stop.
		switch {
		case p != ready:
			return "", "an idle timeout only in ready"
		case e.Action != events.IdleSuspend && e.Action != events.IdleStop:
			return "", fmt.Sprintf("an idle timeout's action %q: suspend or stop", e.Action)
		}
		return p, ""
	case *events.CleanupRequested, *events.CleanedUp:
		// The deadline's clean-up of the driver (issue 24, hole 7): facts
		// of an error, which they leave as it is.
		if p == errored {
			return p, ""
		}
		return "", "a clean-up is the deadline's, in error"
	case *events.ResumeFailed:
		switch {
		case p == starting && l.resume && !l.consumed:
			return suspended, ""
		case p == starting && l.resume:
			return "", "a restore that failed after the consumption is never suspended again"
		}
	case *events.Resumed:
		switch {
		case p == starting && l.resume && l.consumed:
			return starting, ""
		case p == starting && l.resume:
			return "", "resumed before the retained state was consumed"
		case in(ready, suspending) && l.attached:
			return p, "" // "resumed after the attach"
		}
	case *events.Exited:
		switch {
		case in(provisioning, ready, starting, suspending, suspended):
			return errored, ""
		case p == stopping:
			return stopping, ""
		}
	case *events.ResourceLost:
		if in(stopping, stopped, starting, suspending, suspended) {
			return errored, ""
		}
	case *events.DeadlinePassed:
		switch {
		case p.Transient() && e.Phase != p:
			return "", fmt.Sprintf("a deadline of %s settles %s", e.Phase, p)
		case p.Transient():
			// A resume's deadline too, its state not consumed in the log:
			// back to suspended only on the driver's word that the state
			// is still held (resume_failed first, in the same append);
			// otherwise the path after a consumption, error (issue 24,
			// hole 2; CONTRACT §1's v1 row said suspended).
			return errored, ""
		case in(ready, suspended) && l.settled != "" && e.Phase == l.settled:
			return p, ""
		case in(ready, suspended):
			return "", "a deadline is a fact of ready or suspended only in the append of the compensation that settled its phase"
		}
	case *events.DeleteRequested:
		if p != none && p != deleted && p != deleting {
			return deleting, ""
		}
	case *events.Deleted:
		if p == deleting {
			return deleted, ""
		}
	case *events.ForwardOpened:
		if in(ready, suspended) {
			return p, ""
		}
	case *events.ForwardClosed:
		if p != none && p != deleted {
			return p, ""
		}
	case *events.RetainedStateExported:
		// Issue 29: the retained state exported ahead, a fact of
		// suspended (that it names the state held is the check's, step).
		if p == suspended {
			return p, ""
		}
		return "", "an export ahead is a fact of suspended"
	case *events.Active:
		// Activity (README "Activity"): a fact of every phase a sandbox
		// can be active in, not of deleting or the terminal ones.
		if in(provisioning, ready, stopping, stopped, starting, suspending, suspended) {
			return p, ""
		}
	}
	if p.Terminal() {
		return "", fmt.Sprintf("%s is terminal", p)
	}
	return "", "not in CONTRACT §1's table"
}

// apply moves l to phase to after e (which next took).
func (l *life) apply(e events.Event, to events.Phase) {
	from := l.phase
	l.phase, l.settled, l.idle = to, "", ""
	if it, ok := e.(*events.IdleTimeout); ok {
		l.idle = it.Action
	}
	if to != starting {
		l.resume, l.consumed, l.fallback, l.discard = false, false, false, false
	}
	switch e := e.(type) {
	case *events.StartRequested:
		l.resume, l.consumed, l.fallback, l.attached = false, false, false, false
		l.discard = from == suspended
	case *events.ResumeRequested:
		l.resume, l.consumed, l.fallback, l.discard, l.attached = true, false, e.RestartIfRestoreFails, false, false
	case *events.RetainedStateConsumed:
		l.consumed = true
	case *events.RetainedStateDiscarded:
		l.discard = false
	case *events.SupervisorAttached:
		l.attached = true
	case *events.SupervisorDetached:
		l.attached = false
	case *events.SuspendRejected, *events.StopRejected, *events.ResumeFailed:
		l.settled = from
	}
}
