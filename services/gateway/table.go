package gateway

import (
	"fmt"

	"github.com/torpor/torpor/events"
)

// Event type names, as the table reads them.
const (
	evCreated          = "sandbox.created"
	evStartRequested   = "sandbox.start_requested"
	evStarted          = "sandbox.started"
	evStartFailed      = "sandbox.start_failed"
	evStopRequested    = "sandbox.stop_requested"
	evStopped          = "sandbox.stopped"
	evStopRejected     = "sandbox.stop_rejected"
	evSuspendRequested = "sandbox.suspend_requested"
	evSuspended        = "sandbox.suspended"
	evSuspendRejected  = "sandbox.suspend_rejected"
	evResumeRequested  = "sandbox.resume_requested"
	evStateConsumed    = "sandbox.retained_state_consumed"
	evStateDiscarded   = "sandbox.retained_state_discarded"
	evStateInvalidated = "sandbox.retained_state_invalidated"
	evResumeFailed     = "sandbox.resume_failed"
	evResumed          = "sandbox.resumed"
	evExited           = "sandbox.exited"
	evResourceLost     = "sandbox.resource_lost"
	evDeadlinePassed   = "sandbox.deadline_passed"
	evDeleteRequested  = "sandbox.delete_requested"
	evDeleted          = "sandbox.deleted"
	evSupervisorAttach = "supervisor.attached"
	evSupervisorDetach = "supervisor.detached"
	phNone             = events.PhaseNone
	phProvisioning     = events.PhaseProvisioning
	phReady            = events.PhaseReady
	phStopping         = events.PhaseStopping
	phStopped          = events.PhaseStopped
	phStarting         = events.PhaseStarting
	phSuspending       = events.PhaseSuspending
	phSuspended        = events.PhaseSuspended
	phDeleting         = events.PhaseDeleting
	phDeleted          = events.PhaseDeleted
	phError            = events.PhaseError
)

// Transition is one row of the lifecycle: in phase From, event On moves the
// sandbox to phase To.
type Transition struct {
	From events.Phase
	On   string
	To   events.Phase
}

// Table is the whole lifecycle of CONTRACT §1, a row per line. An event that
// keeps the phase (From == To) is allowed there and records a fact. A pair
// that is not in the table is refused.
var Table = []Transition{
	{phNone, evCreated, phProvisioning},
	{phProvisioning, evStarted, phProvisioning},
	{phProvisioning, evSupervisorAttach, phReady},
	{phProvisioning, evStartFailed, phError},
	{phProvisioning, evExited, phError},
	{phProvisioning, evDeadlinePassed, phError},
	{phProvisioning, evDeleteRequested, phDeleting},
	{phReady, evStarted, phReady},
	{phReady, evSupervisorDetach, phProvisioning},
	{phReady, evStopRequested, phStopping},
	{phReady, evSuspendRequested, phSuspending},
	{phReady, evResumed, phReady},
	{phReady, evExited, phError},
	{phReady, evDeleteRequested, phDeleting},
	{phStopping, evStopped, phStopped},
	{phStopping, evStopRejected, phReady},
	{phStopping, evExited, phStopping},
	{phStopping, evResourceLost, phError},
	{phStopping, evDeadlinePassed, phError},
	{phStopping, evDeleteRequested, phDeleting},
	{phStopped, evStartRequested, phStarting},
	{phStopped, evResourceLost, phError},
	{phStopped, evDeleteRequested, phDeleting},
	{phStarting, evStarted, phStarting},
	{phStarting, evSupervisorAttach, phReady},
	{phStarting, evStateConsumed, phStarting},
	{phStarting, evStateDiscarded, phStarting},
	{phStarting, evResumed, phStarting},
	{phStarting, evResumeFailed, phSuspended},
	{phStarting, evStartRequested, phStarting},
	{phStarting, evStopped, phStopped},
	{phStarting, evStartFailed, phError},
	{phStarting, evExited, phError},
	{phStarting, evResourceLost, phError},
	{phStarting, evDeadlinePassed, phError},
	{phStarting, evDeleteRequested, phDeleting},
	{phSuspending, evSuspended, phSuspended},
	{phSuspending, evSuspendRejected, phReady},
	{phSuspending, evExited, phError},
	{phSuspending, evResourceLost, phError},
	{phSuspending, evDeadlinePassed, phSuspending},
	{phSuspending, evResumed, phSuspending},
	{phSuspending, evDeleteRequested, phDeleting},
	{phSuspended, evResumeRequested, phStarting},
	{phSuspended, evStartRequested, phStarting},
	{phSuspended, evResourceLost, phError},
	{phSuspended, evDeleteRequested, phDeleting},
	{phDeleting, evStateInvalidated, phDeleting},
	{phDeleting, evDeleted, phDeleted},
	{phDeleting, evDeadlinePassed, phError},
	{phError, evDeleteRequested, phDeleting},
}

type transitionKey struct {
	from events.Phase
	on   string
}

var transitions = func() map[transitionKey]events.Phase {
	m := make(map[transitionKey]events.Phase, len(Table))
	for _, t := range Table {
		k := transitionKey{t.From, t.On}
		if _, dup := m[k]; dup {
			panic(fmt.Sprintf("gateway: table has (%s, %s) twice", t.From, t.On))
		}
		m[k] = t.To
	}
	return m
}()

// TransitionError says an event is not allowed in a phase.
type TransitionError struct {
	From events.Phase
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
func (e *TransitionError) ContractCode() events.Code { return events.CodeFailedPrecondition }

// Next is the phase after event on in phase from, or a *TransitionError.
func Next(from events.Phase, on string) (events.Phase, error) {
	to, ok := transitions[transitionKey{from, on}]
	if !ok {
		return "", &TransitionError{From: from, On: on}
	}
	return to, nil
}
