package events

import "fmt"

// The lifecycle by event lives here, not in the gateway that decides with
// it, so that every reader of the log (the views, ?at=, the sagas' deadline
// tracking, the checker) folds events through the same table as the
// aggregate and passes over what it refuses (DESIGN: imports point toward
// events). The command table stays with the gateway.

// Transition is one row of the lifecycle: in phase From, event On moves the
// sandbox to phase To.
type Transition struct {
	From Phase
	On   string
	To   Phase
}

// Table is the whole lifecycle of CONTRACT §1 by event, a row per line. An
// event that keeps the phase (From == To) is allowed there and records a
// fact. A pair that is not in the table is refused. A passed deadline moves
// a transient phase to error; a gentler compensation (back to ready, or to
// suspended) is appended before it in the same append, and the deadline is
// then a fact of the phase it settled in. A deadline that ends in error
// appends the driver's clean-up with it (cleanup_requested), a fact of
// error, confirmed by cleaned_up, another. Activity (sandbox.active) is a
// fact of every phase a sandbox can be active in: all but deleting, where
// it is on its way out, and the terminal ones.
var Table = []Transition{
	{PhaseNone, TypeCreated, PhaseProvisioning},
	{PhaseProvisioning, TypeStarted, PhaseProvisioning},
	{PhaseProvisioning, TypeSupervisorAttached, PhaseReady},
	{PhaseProvisioning, TypeStartFailed, PhaseError},
	{PhaseProvisioning, TypeExited, PhaseError},
	{PhaseProvisioning, TypeDeadlinePassed, PhaseError},
	{PhaseProvisioning, TypeDeleteRequested, PhaseDeleting},
	{PhaseReady, TypeStarted, PhaseReady},
	{PhaseReady, TypeSupervisorDetached, PhaseProvisioning},
	{PhaseReady, TypeStopRequested, PhaseStopping},
	{PhaseReady, TypeSuspendRequested, PhaseSuspending},
	{PhaseReady, TypeResumed, PhaseReady},
	{PhaseReady, TypeExited, PhaseError},
	{PhaseReady, TypeDeadlinePassed, PhaseReady},
	{PhaseReady, TypeDeleteRequested, PhaseDeleting},
	{PhaseStopping, TypeStopped, PhaseStopped},
	{PhaseStopping, TypeStopRejected, PhaseReady},
	{PhaseStopping, TypeExited, PhaseStopping},
	{PhaseStopping, TypeResourceLost, PhaseError},
	{PhaseStopping, TypeDeadlinePassed, PhaseError},
	{PhaseStopping, TypeDeleteRequested, PhaseDeleting},
	{PhaseStopped, TypeStartRequested, PhaseStarting},
	{PhaseStopped, TypeResourceLost, PhaseError},
	{PhaseStopped, TypeDeleteRequested, PhaseDeleting},
	{PhaseStarting, TypeStarted, PhaseStarting},
	{PhaseStarting, TypeSupervisorAttached, PhaseReady},
	{PhaseStarting, TypeRetainedStateConsumed, PhaseStarting},
	{PhaseStarting, TypeRetainedStateDiscarded, PhaseStarting},
	{PhaseStarting, TypeResumed, PhaseStarting},
	{PhaseStarting, TypeResumeFailed, PhaseSuspended},
	{PhaseStarting, TypeStartRequested, PhaseStarting},
	{PhaseStarting, TypeStopped, PhaseStopped},
	{PhaseStarting, TypeStartFailed, PhaseError},
	{PhaseStarting, TypeExited, PhaseError},
	{PhaseStarting, TypeResourceLost, PhaseError},
	{PhaseStarting, TypeDeadlinePassed, PhaseError},
	{PhaseStarting, TypeDeleteRequested, PhaseDeleting},
	{PhaseSuspending, TypeSuspended, PhaseSuspended},
	{PhaseSuspending, TypeSuspendRejected, PhaseReady},
	{PhaseSuspending, TypeExited, PhaseError},
	{PhaseSuspending, TypeResourceLost, PhaseError},
	{PhaseSuspending, TypeDeadlinePassed, PhaseError},
	{PhaseSuspending, TypeResumed, PhaseSuspending},
	{PhaseSuspending, TypeDeleteRequested, PhaseDeleting},
	{PhaseSuspended, TypeResumeRequested, PhaseStarting},
	{PhaseSuspended, TypeStartRequested, PhaseStarting},
	{PhaseSuspended, TypeExited, PhaseError},
	{PhaseSuspended, TypeResourceLost, PhaseError},
	{PhaseSuspended, TypeDeadlinePassed, PhaseSuspended},
	{PhaseSuspended, TypeDeleteRequested, PhaseDeleting},
	{PhaseDeleting, TypeRetainedStateInvalidated, PhaseDeleting},
	{PhaseDeleting, TypeDeleted, PhaseDeleted},
	{PhaseDeleting, TypeDeadlinePassed, PhaseError},
	{PhaseError, TypeRetainedStateInvalidated, PhaseError},
	{PhaseError, TypeCleanupRequested, PhaseError},
	{PhaseError, TypeCleanedUp, PhaseError},
	{PhaseError, TypeDeleteRequested, PhaseDeleting},
	{PhaseReady, TypeForwardOpened, PhaseReady},
	{PhaseSuspended, TypeForwardOpened, PhaseSuspended},
	{PhaseProvisioning, TypeForwardClosed, PhaseProvisioning},
	{PhaseReady, TypeForwardClosed, PhaseReady},
	{PhaseStopping, TypeForwardClosed, PhaseStopping},
	{PhaseStopped, TypeForwardClosed, PhaseStopped},
	{PhaseStarting, TypeForwardClosed, PhaseStarting},
	{PhaseSuspending, TypeForwardClosed, PhaseSuspending},
	{PhaseSuspended, TypeForwardClosed, PhaseSuspended},
	{PhaseDeleting, TypeForwardClosed, PhaseDeleting},
	{PhaseError, TypeForwardClosed, PhaseError},
	// Expiry (expiry.go): sandbox.expired is a fact of the phase it finds;
	// a retained state invalidated in suspended (its retention expired, or
	// a TTL that stops it) stops the sandbox: never suspended on it again.
	{PhaseProvisioning, TypeExpired, PhaseProvisioning},
	{PhaseReady, TypeExpired, PhaseReady},
	{PhaseStopping, TypeExpired, PhaseStopping},
	{PhaseStopped, TypeExpired, PhaseStopped},
	{PhaseStarting, TypeExpired, PhaseStarting},
	{PhaseSuspending, TypeExpired, PhaseSuspending},
	{PhaseSuspended, TypeExpired, PhaseSuspended},
	{PhaseError, TypeExpired, PhaseError},
	{PhaseSuspended, TypeRetainedStateInvalidated, PhaseStopped},
	{PhaseProvisioning, TypeActive, PhaseProvisioning},
	{PhaseReady, TypeActive, PhaseReady},
	{PhaseStopping, TypeActive, PhaseStopping},
	{PhaseStopped, TypeActive, PhaseStopped},
	{PhaseStarting, TypeActive, PhaseStarting},
	{PhaseSuspending, TypeActive, PhaseSuspending},
	{PhaseSuspended, TypeActive, PhaseSuspended},
	// Idle (idle.go): an idle timeout is a fact of ready; the intent
	// appended with it moves the sandbox.
	{PhaseReady, TypeIdleTimeout, PhaseReady},
	// Export ahead (movable.go, issue 29): a fact of suspended, taken only
	// while the state it names is held (Restore.Refuses).
	{PhaseSuspended, TypeRetainedStateExported, PhaseSuspended},
}

type transitionKey struct {
	from Phase
	on   string
}

var transitions = func() map[transitionKey]Phase {
	m := make(map[transitionKey]Phase, len(Table))
	for _, t := range Table {
		k := transitionKey{t.From, t.On}
		if _, dup := m[k]; dup {
			panic(fmt.Sprintf("events: table has (%s, %s) twice", t.From, t.On))
		}
		m[k] = t.To
	}
	return m
}()

// TransitionError says an event is not allowed in a phase.
type TransitionError struct {
	From Phase
	On   string
}

func (e *TransitionError) Error() string {
	from := string(e.From)
	if from == "" {
		from = "(none)"
	}
	return fmt.Sprintf("%s is not allowed in phase %s", e.On, from)
}

// ContractCode makes a refused transition FAILED_PRECONDITION everywhere.
func (e *TransitionError) ContractCode() Code { return CodeFailedPrecondition }

// Next is the phase after event on in phase from, or a *TransitionError.
func Next(from Phase, on string) (Phase, error) {
	to, ok := transitions[transitionKey{from, on}]
	if !ok {
		return "", &TransitionError{From: from, On: on}
	}
	return to, nil
}
