package gateway

import (
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

// Transition is one row of the lifecycle (events.Transition).
type Transition = events.Transition

// Table is the whole lifecycle of CONTRACT §1 by event (events.Table, where
// every reader of the log folds through it).
var Table = events.Table

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
	// Busy: another command is under way whose outcome would leave this
	// one undone (a start while a resume is under way: the resume may
	// fail back to suspended); ABORTED, retry once it settles.
	Busy
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
	// Recent holds when a sandbox.active was recorded within the activity
	// window before the activity a touch brings (Command.Window).
	Recent
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
	{phStarting, VerbStart, AfterResume, Busy, nil},
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
	{phProvisioning, VerbTouch, Recent, Done, nil},
	{phProvisioning, VerbTouch, Always, Emit, []string{events.TypeActive}},
	{phReady, VerbTouch, Recent, Done, nil},
	{phReady, VerbTouch, Always, Emit, []string{events.TypeActive}},
	{phStopping, VerbTouch, Recent, Done, nil},
	{phStopping, VerbTouch, Always, Emit, []string{events.TypeActive}},
	{phStopped, VerbTouch, Recent, Done, nil},
	{phStopped, VerbTouch, Always, Emit, []string{events.TypeActive}},
	{phStarting, VerbTouch, Recent, Done, nil},
	{phStarting, VerbTouch, Always, Emit, []string{events.TypeActive}},
	{phSuspending, VerbTouch, Recent, Done, nil},
	{phSuspending, VerbTouch, Always, Emit, []string{events.TypeActive}},
	{phSuspended, VerbTouch, Recent, Done, nil},
	{phSuspended, VerbTouch, Always, Emit, []string{events.TypeActive}},
}

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

// TransitionError says an event is not allowed in a phase (events.TransitionError).
type TransitionError = events.TransitionError

// Next is the phase after event on in phase from, or a *TransitionError
// (events.Next).
func Next(from events.Phase, on string) (events.Phase, error) { return events.Next(from, on) }

// Facts are what a command row's guard may ask of the sandbox besides its
// phase.
type Facts struct {
	AfterResume bool
	CanSuspend  bool
	Holds       bool
	Forwarded   bool
	Recent      bool
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
	case Recent:
		return f.Recent
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
