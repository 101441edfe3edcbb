package gateway

import (
	"fmt"

	"github.com/torpor/torpor/events"
)

// The phases, short, so that each table reads as one screen.
const (
	phNone         = events.PhaseNone
	phProvisioning = events.PhaseProvisioning
	phReady        = events.PhaseReady
	phStopping     = events.PhaseStopping
	phStopped      = events.PhaseStopped
	phStarting     = events.PhaseStarting
	phSuspending   = events.PhaseSuspending
	phSuspended    = events.PhaseSuspended
	phDeleting     = events.PhaseDeleting
	phDeleted      = events.PhaseDeleted
	phError        = events.PhaseError
	// anyPhase in a command row matches every phase the rows above it left.
	anyPhase events.Phase = "*"
)

// Transition is one row of the lifecycle: in phase From, event On moves the
// sandbox to phase To.
type Transition struct {
	From events.Phase
	On   string
	To   events.Phase
}

// Table is the whole lifecycle of CONTRACT §1 by event, a row per line. An
// event that keeps the phase (From == To) is allowed there and records a
// fact. A pair that is not in the table is refused. A passed deadline moves
// a transient phase to error; a gentler compensation (back to ready, or to
// suspended) is appended before it in the same append, and the deadline is
// then a fact of the phase it settled in.
var Table = []Transition{
	{phNone, events.TypeCreated, phProvisioning},
	{phProvisioning, events.TypeStarted, phProvisioning},
	{phProvisioning, events.TypeSupervisorAttached, phReady},
	{phProvisioning, events.TypeStartFailed, phError},
	{phProvisioning, events.TypeExited, phError},
	{phProvisioning, events.TypeDeadlinePassed, phError},
	{phProvisioning, events.TypeDeleteRequested, phDeleting},
	{phReady, events.TypeStarted, phReady},
	{phReady, events.TypeSupervisorDetached, phProvisioning},
	{phReady, events.TypeStopRequested, phStopping},
	{phReady, events.TypeSuspendRequested, phSuspending},
	{phReady, events.TypeResumed, phReady},
	{phReady, events.TypeExited, phError},
	{phReady, events.TypeDeadlinePassed, phReady},
	{phReady, events.TypeDeleteRequested, phDeleting},
	{phStopping, events.TypeStopped, phStopped},
	{phStopping, events.TypeStopRejected, phReady},
	{phStopping, events.TypeExited, phStopping},
	{phStopping, events.TypeResourceLost, phError},
	{phStopping, events.TypeDeadlinePassed, phError},
	{phStopping, events.TypeDeleteRequested, phDeleting},
	{phStopped, events.TypeStartRequested, phStarting},
	{phStopped, events.TypeResourceLost, phError},
	{phStopped, events.TypeDeleteRequested, phDeleting},
	{phStarting, events.TypeStarted, phStarting},
	{phStarting, events.TypeSupervisorAttached, phReady},
	{phStarting, events.TypeRetainedStateConsumed, phStarting},
	{phStarting, events.TypeRetainedStateDiscarded, phStarting},
	{phStarting, events.TypeResumed, phStarting},
	{phStarting, events.TypeResumeFailed, phSuspended},
	{phStarting, events.TypeStartRequested, phStarting},
	{phStarting, events.TypeStopped, phStopped},
	{phStarting, events.TypeStartFailed, phError},
	{phStarting, events.TypeExited, phError},
	{phStarting, events.TypeResourceLost, phError},
	{phStarting, events.TypeDeadlinePassed, phError},
	{phStarting, events.TypeDeleteRequested, phDeleting},
	{phSuspending, events.TypeSuspended, phSuspended},
	{phSuspending, events.TypeSuspendRejected, phReady},
	{phSuspending, events.TypeExited, phError},
	{phSuspending, events.TypeResourceLost, phError},
	{phSuspending, events.TypeDeadlinePassed, phError},
	{phSuspending, events.TypeResumed, phSuspending},
	{phSuspending, events.TypeDeleteRequested, phDeleting},
	{phSuspended, events.TypeResumeRequested, phStarting},
	{phSuspended, events.TypeStartRequested, phStarting},
	{phSuspended, events.TypeExited, phError},
	{phSuspended, events.TypeResourceLost, phError},
	{phSuspended, events.TypeDeadlinePassed, phSuspended},
	{phSuspended, events.TypeDeleteRequested, phDeleting},
	{phDeleting, events.TypeRetainedStateInvalidated, phDeleting},
	{phDeleting, events.TypeDeleted, phDeleted},
	{phDeleting, events.TypeDeadlinePassed, phError},
	{phError, events.TypeRetainedStateInvalidated, phError},
	{phError, events.TypeDeleteRequested, phDeleting},
	{phReady, events.TypeForwardOpened, phReady},
	{phSuspended, events.TypeForwardOpened, phSuspended},
	{phProvisioning, events.TypeForwardClosed, phProvisioning},
	{phReady, events.TypeForwardClosed, phReady},
	{phStopping, events.TypeForwardClosed, phStopping},
	{phStopped, events.TypeForwardClosed, phStopped},
	{phStarting, events.TypeForwardClosed, phStarting},
	{phSuspending, events.TypeForwardClosed, phSuspending},
	{phSuspended, events.TypeForwardClosed, phSuspended},
	{phDeleting, events.TypeForwardClosed, phDeleting},
	{phError, events.TypeForwardClosed, phError},
}

// Answer is what a command row does.
type Answer int

const (
	// Emit appends the row's events.
	Emit Answer = iota
	// Done is an idempotent repeat: nothing to append, the command succeeds.
	Done
	// Unimplemented: the driver lacks the capability; nothing moves.
	Unimplemented
	// Exists: a create of a sandbox that exists.
	Exists
	// Missing: a command on a sandbox that does not exist.
	Missing
	// Lost: a resume of a suspended sandbox that holds no retained state
	// (a log written before the consumption was guarded): FAILED_PRECONDITION.
	Lost
	// NoForward: an unforward of a forward the sandbox does not have.
	NoForward
)

// Guard is the one fact besides the phase a command row may need.
type Guard int

const (
	// Always holds.
	Always Guard = iota
	// AfterResume holds while the current generation comes from a resume:
	// from the resume's request until the next start, stop or suspend.
	AfterResume
	// CannotSuspend holds when the sandbox's driver cannot suspend it.
	CannotSuspend
	// Holds holds while a retained state is held (a restore reference).
	Holds
	// Forwarded holds when the sandbox has the forward the command names.
	Forwarded
)

// anyVerb in a command row matches every verb.
const anyVerb = "*"

// Rule is one row of the command table: in phase Phase, verb Verb, when
// guard If holds, the command Then does what the answer says, appending the
// events named in Events (in order, atomically) for Emit.
type Rule struct {
	Phase  events.Phase
	Verb   string
	If     Guard
	Then   Answer
	Events []string
}

// Commands is which command is allowed in which phase (CONTRACT §1), a row
// per line, read top-down: the first row that matches the phase, the verb
// and its guard decides. A command no row matches is refused
// (FAILED_PRECONDITION, naming the phases where the verb emits). The
// idempotent repeats of the contract (suspend on suspended, resume on ready
// after a resume, stop on stopped, start on ready) are Done rows.
var Commands = []Rule{
	{phNone, VerbCreate, Always, Emit, []string{events.TypeCreated}},
	{anyPhase, VerbCreate, Always, Exists, nil},
	{phNone, anyVerb, Always, Missing, nil},
	{phStopped, VerbStart, Always, Emit, []string{events.TypeStartRequested}},
	{phSuspended, VerbStart, Always, Emit, []string{events.TypeStartRequested, events.TypeRetainedStateDiscarded}},
	{phReady, VerbStart, Always, Done, nil},
	{phStarting, VerbStart, Always, Done, nil},
	{phReady, VerbStop, Always, Emit, []string{events.TypeStopRequested}},
	{phStopping, VerbStop, Always, Done, nil},
	{phStopped, VerbStop, Always, Done, nil},
	{phSuspending, VerbSuspend, Always, Done, nil},
	{phSuspended, VerbSuspend, Always, Done, nil},
	{anyPhase, VerbSuspend, CannotSuspend, Unimplemented, nil},
	{phReady, VerbSuspend, Always, Emit, []string{events.TypeSuspendRequested}},
	{phSuspended, VerbResume, Holds, Emit, []string{events.TypeResumeRequested}},
	{phSuspended, VerbResume, Always, Lost, nil},
	{phStarting, VerbResume, AfterResume, Done, nil},
	{phReady, VerbResume, AfterResume, Done, nil},
	{phDeleting, VerbDelete, Always, Done, nil},
	{phDeleted, VerbDelete, Always, Done, nil},
	{anyPhase, VerbDelete, Always, Emit, []string{events.TypeDeleteRequested}},
	{phReady, VerbForward, Always, Emit, []string{events.TypeForwardOpened}},
	{phSuspended, VerbForward, Always, Emit, []string{events.TypeForwardOpened}},
	{phDeleted, VerbUnforward, Always, NoForward, nil},
	{anyPhase, VerbUnforward, Forwarded, Emit, []string{events.TypeForwardClosed}},
	{anyPhase, VerbUnforward, Always, NoForward, nil},
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

// commandRules are the rows of Commands that can match each verb, in order,
// and needs the phases where each verb emits, for the refusal's message.
var commandRules, needs = func() (map[string][]Rule, map[string][]events.Phase) {
	rules, needs := map[string][]Rule{}, map[string][]events.Phase{}
	for _, verb := range allVerbs {
		for _, r := range Commands {
			if r.Verb != verb && r.Verb != anyVerb {
				continue
			}
			rules[verb] = append(rules[verb], r)
			if r.Then == Emit && r.Phase != anyPhase {
				needs[verb] = append(needs[verb], r.Phase)
			}
		}
	}
	return rules, needs
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

// Facts are what a command row's guard may ask of the sandbox besides its
// phase.
type Facts struct {
	AfterResume bool
	CanSuspend  bool
	Holds       bool
	Forwarded   bool
}

func (f Facts) hold(g Guard) bool {
	switch g {
	case AfterResume:
		return f.AfterResume
	case CannotSuspend:
		return !f.CanSuspend
	case Holds:
		return f.Holds
	case Forwarded:
		return f.Forwarded
	}
	return true
}

// Lookup returns the first row of Commands for verb in phase p whose guard
// holds, and false when none does (the command is refused).
func Lookup(p events.Phase, verb string, f Facts) (Rule, bool) {
	for _, r := range commandRules[verb] {
		if (r.Phase == p || r.Phase == anyPhase) && f.hold(r.If) {
			return r, true
		}
	}
	return Rule{}, false
}
