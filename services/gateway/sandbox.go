package gateway

import (
	"errors"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Sandbox is the aggregate: the state folded from one sandbox's events, enough
// to decide the next command. Its methods are pure; only apply moves it, and
// only through the table.
type Sandbox struct {
	ID         string
	Seq        uint64
	Phase      events.Phase
	Spec       events.Created
	Generation int64
	// RestoreRef is the retained state held, if any, and Retained the
	// generation it retains (the one suspended): after a failed resume the
	// current Generation is the resume's, yet the retained workload is
	// still Retained's.
	RestoreRef string
	Retained   int64
	// Resuming is set from a resume request until the next suspend, stop or
	// start, or its failure, so that resume on a sandbox it made ready is a
	// no-op.
	Resuming bool
	// Exited is set once an exit result is recorded; it is never overwritten.
	Exited bool
	// Attached is the generation whose supervisor's attach is recorded and
	// not ended since (by a detach, an exit or a stop); 0 for none.
	Attached int64
	// Fallback is the resume's restart_if_restore_fails, while Resuming.
	Fallback bool
	// ResumeNode is the newest resume request's target node, when it moves
	// the sandbox to another node.
	ResumeNode string
	// Restored is the newest generation whose restore is recorded
	// (sandbox.resumed, the resume saga's); 0 for none.
	Restored int64
	// Started is the newest generation whose start is recorded
	// (sandbox.started, the start saga's), or whose supervisor attached (a
	// log written before attaches waited for the saga's record); 0 for
	// none.
	Started int64
	// Entered is when the sandbox entered its phase (the time of the event
	// that moved it there), what a passed deadline is measured from.
	Entered time.Time
	// keys are the keyed commands the sandbox's log holds, each with the
	// sequence of its last own event (see keys.go): what a retry answers.
	// Shared with the states cloned from this one; pending are the keys of
	// events folded here and not yet stored.
	keys    map[[16]byte]uint64
	pending [][16]byte
	// Active is when the newest sandbox.active was recorded (its
	// envelope's time), zero for none: the activity window is measured
	// from it (Command.Window).
	Active time.Time
	// Intent is the command id of the newest intent (the command under
	// way while the phase is transient): whom a twin joins (see joined).
	Intent string
	View   events.View
	// HeldSince is when the retained state held was suspended (its
	// retention's clock), and TTLSpent says a TTL expiry is recorded.
	HeldSince time.Time
	TTLSpent  bool
	// IdleSpent says an idle timeout is recorded since the last activity
	// (idle.go): one decision per idle stretch.
	IdleSpent bool
}

// Exists reports whether the sandbox has been created.
func (s *Sandbox) Exists() bool { return s.Phase != events.PhaseNone }

// Gone reports whether the sandbox is deleted: its name is free again.
func (s *Sandbox) Gone() bool { return s.Phase == events.PhaseDeleted }

// seen reports whether the command id has already been applied.
func (s *Sandbox) seen(commandID string) bool {
	_, ok := s.keyed(commandID)
	return ok
}

// apply folds one stored event into s, moving the phase through the table.
// An unknown type or a pair the table refuses is an error: the aggregate does
// not guess.
func (s *Sandbox) apply(env events.Envelope) error {
	e, err := env.Decode()
	if err != nil {
		return fmt.Errorf("sandbox %s seq %d: %w", env.SandboxID, env.Seq, err)
	}
	to, err := Next(s.Phase, env.Type)
	if err != nil {
		return fmt.Errorf("sandbox %s seq %d: %w", env.SandboxID, env.Seq, err)
	}
	if x, ok := e.(*events.RetainedStateExported); ok {
		if err := exportedHeld(s, x); err != nil {
			return fmt.Errorf("seq %d: %w", env.Seq, err)
		}
	}
	if s.ID == "" {
		s.ID = env.SandboxID
	}
	if to != s.Phase {
		s.Entered = env.Time
	}
	s.Phase = to
	if env.Seq != 0 {
		s.Seq = env.Seq
	}
	switch e := e.(type) {
	case *events.Created:
		s.Spec, s.Generation = *e, e.Generation
	case *events.StartRequested:
		s.Generation, s.Resuming, s.Exited = e.Generation, false, false
	case *events.SuspendRequested, *events.StopRequested:
		s.Resuming = false
	case *events.Suspended:
		s.RestoreRef, s.Retained = e.RestoreRef, e.Generation
		s.HeldSince = env.Time
	case *events.Expired:
		s.TTLSpent = s.TTLSpent || e.Policy == events.ExpiryTTL
	case *events.ResumeRequested:
		s.Generation, s.Resuming, s.Exited, s.Fallback, s.ResumeNode = e.Generation, true, false, e.RestartIfRestoreFails, e.Node
	case *events.ResumeFailed:
		s.Resuming = false
	case *events.Resumed:
		s.Restored = e.Generation
	case *events.Started:
		s.Started = e.Generation
	case *events.RetainedStateConsumed:
		s.RestoreRef = ""
		if e.Node != "" {
			s.Spec.Node = e.Node // the sandbox belongs to the node it was restored on
		}
	case *events.RetainedStateDiscarded, *events.RetainedStateInvalidated:
		s.RestoreRef = ""
	case *events.SupervisorAttached:
		s.Attached, s.Started = e.Generation, max(s.Started, e.Generation)
	case *events.SupervisorDetached, *events.Stopped:
		s.Attached = 0
	case *events.Exited:
		s.Exited, s.Attached = true, 0
	case *events.Active:
		s.Active = env.Time
	}
	if _, ok := events.Activity(env, e); ok {
		s.IdleSpent = false
	}
	if _, ok := e.(*events.IdleTimeout); ok {
		s.IdleSpent = true
	}
	s.note(env)
	env.Phase = to
	s.View.Fold(env)
	return nil
}

// Command is one lifecycle command, as the bus and HTTP hand it in.
type Command struct {
	Verb string
	ID   string
	// Actor is who asked (the HTTP remote, the bus client), for the audit.
	Actor string
	// IdempotencyKey makes a retried command land once.
	IdempotencyKey string
	// CommandID identifies the command; derived from the idempotency key when
	// there is one (see CommandID), else fresh.
	CommandID string
	Create    events.CreateRequest
	// Node is the node a created sandbox belongs to.
	Node string
	// RestartIfRestoreFails and ResumeOn (a node other than the sandbox's)
	// are resume's options.
	RestartIfRestoreFails bool
	ResumeOn              string
	// EnvSealed is a create's env values sealed (Credentials.SealEnv);
	// Create.Env then holds the names only.
	EnvSealed string
	// Forward is the forward a forward command opens (bound already) or,
	// by its ID, the one an unforward closes.
	Forward events.Forward
	// Expiry is a create's expiry, resolved (events.ParseCreateExpiry).
	Expiry events.Created
	// Source, At and Window are a touch's (and any activity's, Service.Active):
	// where the activity comes from (events.ActiveTouch, …), when it was
	// seen, and the activity window: a sandbox.active recorded less than
	// Window before At makes the touch an idempotent repeat.
	Source string
	At     time.Time
	Window time.Duration
}

// Verbs of commands.
const (
	VerbCreate  = "create"
	VerbStart   = "start"
	VerbStop    = "stop"
	VerbSuspend = "suspend"
	VerbResume  = "resume"
	VerbDelete  = "delete"
	// VerbForward opens a TCP forward to a port of the sandbox and
	// VerbUnforward closes one (HTTP only: they need the forward bound).
	VerbForward   = "forward"
	VerbUnforward = "unforward"
	// VerbTouch records activity of a sandbox (README "Activity"): a
	// sandbox.active, at most one per activity window (HTTP only, as the
	// activity a forward or a supervisor reports: Service.Active).
	VerbTouch = "touch"
)

// Verbs lists the lifecycle verbs, in the order of the contract (the bus
// serves these).
var Verbs = []string{VerbCreate, VerbStart, VerbStop, VerbSuspend, VerbResume, VerbDelete}

// allVerbs are every verb of the command table.
var allVerbs = append(Verbs[:len(Verbs):len(Verbs)], VerbForward, VerbUnforward, VerbTouch)

// decide is the pure heart of the gateway: given the state, a command and the
// driver's capabilities, the events the command causes. No events and no
// error means the command is an idempotent repeat. What is allowed where is
// the command table (Commands); decide looks the row up and supplies the
// facts its events need.
func decide(s *Sandbox, c Command, caps compute.Capabilities) ([]events.Event, error) {
	if s.Exists() && s.seen(c.CommandID) {
		return nil, nil
	}
	if _, known := commandRules[c.Verb]; !known {
		return nil, events.Errorf(events.CodeInvalidArgument, "unknown command %q", c.Verb)
	}
	if c.Verb == VerbResume && c.ResumeOn != "" && c.ResumeOn != s.Spec.Node && !caps.ResumeElsewhere {
		return nil, events.Errorf(events.CodeFailedPrecondition, "driver %s cannot resume on another node: the retained state of %s stays on %s", s.Spec.Driver, s.ID, s.Spec.Node)
	}
	_, open := s.View.Forward(c.Forward.ID)
	recent := !s.Active.IsZero() && c.At.Sub(s.Active) < c.Window
	row, ok := Lookup(s.Phase, c.Verb, Facts{AfterResume: s.Resuming, CanSuspend: caps.Suspend, Holds: s.RestoreRef != "", Forwarded: open, Recent: recent})
	if !ok {
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s; %s needs %s", s.ID, s.Phase, c.Verb, joinPhases(needs[c.Verb]))
	}
	switch row.Then {
	case Done:
		return nil, nil
	case Unimplemented:
		return nil, events.Errorf(events.CodeUnimplemented, "driver %s cannot suspend sandbox %s", s.Spec.Driver, s.ID)
	case Exists:
		return nil, events.Errorf(events.CodeAlreadyExists, "sandbox %s already exists", s.ID)
	case Missing:
		return nil, events.Errorf(events.CodeNotFound, "sandbox %s not found", c.ID)
	case Lost:
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s but holds no retained state; start it cold", s.ID, s.Phase)
	case Busy:
		return nil, events.Errorf(events.CodeAborted, "sandbox %s is %s: a resume is under way; retry the %s once it settles (ready: nothing to do; suspended: a cold start)", s.ID, s.Phase, c.Verb)
	case NoForward:
		return nil, events.Errorf(events.CodeNotFound, "sandbox %s has no forward %q", s.ID, c.Forward.ID)
	}
	evs := make([]events.Event, len(row.Events))
	for i, typ := range row.Events {
		evs[i] = caused(typ, s, c)
	}
	return evs, nil
}

// caused builds the event of type typ that command c causes on s, from the
// facts it carries: the generation it mints or speaks for, the retained
// state held, the request.
func caused(typ string, s *Sandbox, c Command) events.Event {
	switch typ {
	case events.TypeCreated:
		r := c.Create
		return &events.Created{
			Name: r.Name, Driver: r.Driver, Node: c.Node, DriverOptions: r.DriverOptions,
			Command: r.Command, Env: r.Env, Labels: r.Labels, Generation: 1, EnvSealed: c.EnvSealed,
			ExpiresAt: c.Expiry.ExpiresAt, OnExpiry: c.Expiry.OnExpiry, RetainFor: c.Expiry.RetainFor,
			WakeOnTraffic:           r.WakeOnTraffic,
			Idle:                    c.Expiry.Idle,
			TTLPausesWhileSuspended: r.TTLPausesWhileSuspended,
		}
	case events.TypeStartRequested:
		return &events.StartRequested{Generation: s.Generation + 1}
	case events.TypeRetainedStateDiscarded:
		return &events.RetainedStateDiscarded{RestoreRef: s.RestoreRef}
	case events.TypeStopRequested:
		return &events.StopRequested{Generation: s.Generation}
	case events.TypeSuspendRequested:
		return &events.SuspendRequested{Generation: s.Generation}
	case events.TypeResumeRequested:
		r := &events.ResumeRequested{Generation: s.Generation + 1, RestoreRef: s.RestoreRef, RestartIfRestoreFails: c.RestartIfRestoreFails}
		if c.ResumeOn != s.Spec.Node {
			r.Node = c.ResumeOn // the state moves there
		}
		return r
	case events.TypeDeleteRequested:
		return &events.DeleteRequested{}
	case events.TypeForwardOpened:
		f := c.Forward
		return &events.ForwardOpened{ForwardID: f.ID, Listen: f.Listen, Address: f.Address, Port: f.Port}
	case events.TypeForwardClosed:
		return &events.ForwardClosed{ForwardID: c.Forward.ID}
	case events.TypeActive:
		return &events.Active{Source: c.Source, At: c.At}
	}
	panic("gateway: the command table names " + typ + ", which no command causes")
}

func joinPhases(ps []events.Phase) string {
	out := ""
	for i, p := range ps {
		switch {
		case i == 0:
		case i == len(ps)-1:
			out += " or "
		default:
			out += ", "
		}
		out += string(p)
	}
	return out
}

// report is an event that speaks for one supervisor generation (see
// events.Event): a driver's outcome or a supervisor's report.
type report interface {
	events.Event
	SpeaksFor() int64
}

// Owner is the generation whose reports s takes: the current one, except
// in suspended, where it is the generation that owns the retained state
// (the frozen workload's), which a failed resume leaves behind the
// generation it raised (issue 24, hole 5): that workload's death is still
// its sandbox's.
func (s *Sandbox) Owner() int64 {
	if s.Phase == events.PhaseSuspended && s.RestoreRef != "" && s.Retained != 0 {
		return s.Retained
	}
	return s.Generation
}

// fence refuses a reported event (from a saga or a supervisor) that speaks for
// another generation than the owner (the current one, or in suspended the
// retained state's), or that would overwrite an exit result: reports from
// older generations change nothing.
func fence(s *Sandbox, e events.Event) error {
	if r, ok := e.(report); ok && r.SpeaksFor() != s.Owner() {
		return fenced(events.Errorf(events.CodeFailedPrecondition, "sandbox %s: %s speaks for generation %d, current is %d", s.ID, e.Type(), r.SpeaksFor(), s.Owner()))
	}
	if sr, ok := e.(*events.StartRequested); ok && sr.Generation != s.Generation+1 {
		return events.Errorf(events.CodeFailedPrecondition, "sandbox %s: start_requested mints generation %d, want %d", s.ID, sr.Generation, s.Generation+1)
	}
	if _, ok := e.(*events.Exited); ok && s.Exited {
		return events.Errorf(events.CodeFailedPrecondition, "sandbox %s: exit result already recorded", s.ID)
	}
	return nil
}

// errFenced marks the refusal of a report of another generation than the
// sandbox's current one (fenced), for the metrics.
var errFenced = errors.New("fenced")

// fenced is e marked errFenced; its code and message stay.
func fenced(e *events.Error) *events.Error {
	e.Err = errFenced
	return e
}

// reported decides what a report (a saga's outcome, a supervisor's report,
// a passed deadline's compensation) appends, every event judged against the
// state before the report:
//   - every event must speak for the current generation (fence);
//   - a fact the log already holds is left out: a consumption or a restore
//     a re-driven resume saga records again (after a crash between its two
//     records, say), an attach repeated by a supervisor attached already;
//   - a restore failure "before the consumption" when the consumption is
//     recorded is a lie the log disproves (a driver that forgot, say): it
//     becomes the failure after the consumption, a cold start when the
//     resume allows the fallback, else stopped with RetainedStateLost, so a
//     consumed reference is never suspended on again (CONTRACT invariant 1);
//     a restore failure, a fallback start or the state lost with no resume
//     under way is refused;
//   - an exit, or the resource lost, while a retained state is held
//     invalidates it in the same append (the workload it retains is dead);
//   - a passed deadline must be of the phase the sandbox is in, and that
//     phase must have lasted the deadline at now: a deadline of an earlier
//     stay in the phase is refused.
//
// Whether what is left may be appended in the sandbox's phase is the table's
// to say, when it is applied.
func reported(s *Sandbox, evs []events.Event, now time.Time) ([]events.Event, error) {
	if !s.Exists() {
		return nil, events.Errorf(events.CodeNotFound, "sandbox %s not found", s.ID)
	}
	out := make([]events.Event, 0, len(evs)+1)
	// held is the retained state as the events appended so far leave it:
	// a consumption earlier in the same report (a deadline's, before the
	// exit it observed) leaves nothing for an exit to invalidate.
	held := s.RestoreRef
	for _, e := range evs {
		if err := fence(s, e); err != nil {
			return nil, err
		}
		switch e := e.(type) {
		case *events.RetainedStateConsumed:
			if s.RestoreRef == "" || s.RestoreRef != e.RestoreRef {
				continue // recorded already, or never held
			}
			if !s.Resuming {
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: a consumption but no resume is under way", s.ID)
			}
			held = ""
		case *events.SupervisorAttached:
			if s.Attached == e.Generation {
				continue // a repeated attach of the supervisor attached already
			}
		case *events.Resumed:
			if s.Restored == e.Generation {
				continue // recorded already, by this resume's saga before it was re-driven
			}
			if !s.Resuming {
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: a restore but no resume is under way", s.ID)
			}
			// The consumption is the point of no return and comes first
			// (CONTRACT §3), in this report or one before it.
			if held != "" {
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: a restore (generation %d) before its retained state was consumed", s.ID, e.Generation)
			}
		case *events.ResumeFailed:
			if !s.Resuming || s.Phase != events.PhaseStarting {
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: a restore failed but no resume is under way", s.ID)
			}
			if s.RestoreRef == "" {
				out = append(out, afterConsumption(s))
				continue
			}
		// A report of a cold start (the fallback) or of the state lost
		// comes of a resume only.
		case *events.StartRequested:
			if !s.Resuming || s.Phase != events.PhaseStarting {
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: a fallback start (generation %d) but no resume is under way", s.ID, e.Generation)
			}
			if !s.Fallback {
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: a fallback start (generation %d) of a resume that does not allow one", s.ID, e.Generation)
			}
		case *events.Stopped:
			if e.Reason == events.ReasonRetainedStateLost && !s.Resuming {
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: the retained state lost but no resume is under way", s.ID)
			}
			// In starting, the only stop is a resume's failure after its
			// consumption (CONTRACT §1): the state lost, nothing held.
			if s.Phase == events.PhaseStarting && (e.Reason != events.ReasonRetainedStateLost || held != "") {
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: stopped in starting other than a resume's state lost after its consumption", s.ID)
			}
		case *events.Exited, *events.ResourceLost:
			if held != "" {
				out = append(out, e, &events.RetainedStateInvalidated{RestoreRef: held})
				continue
			}
		case *events.Expired:
			acts, err := expired(s, e, now)
			if err != nil {
				return nil, err
			}
			out = append(out, acts...)
			continue
		case *events.RetainedStateInvalidated:
			if s.Phase == events.PhaseSuspended {
				// Only an expiry stops a suspended sandbox so (expired).
				return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: a retained state invalidated in suspended but no expiry", s.ID)
			}
		case *events.RetainedStateExported:
			// Issue 29: judged at the head the append is checked against,
			// so a note of an export that a resume, a discard, a delete or
			// a new suspension overtook is refused, never appended.
			if err := exportedHeld(s, e); err != nil {
				return nil, err
			}
		case *events.IdleTimeout:
			// Decided by the gateway alone (Service.Record, idled).
			return nil, events.Errorf(events.CodeInvalidArgument, "sandbox %s: an idle timeout is reported alone", s.ID)
		case *events.DeadlinePassed:
			if !e.Phase.Transient() {
				return nil, events.Errorf(events.CodeInvalidArgument, "sandbox %s: a deadline of %s, which is no transient phase", s.ID, e.Phase)
			}
			if err := passed(s, e, now); err != nil {
				return nil, err
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// afterConsumption is the outcome of a restore that failed after its
// retained state was consumed (CONTRACT §1): a cold start of the next
// generation when the resume allows it, else stopped, the state lost.
func afterConsumption(s *Sandbox) events.Event {
	if s.Fallback {
		return &events.StartRequested{Generation: s.Generation + 1, Fallback: true}
	}
	return &events.Stopped{Generation: s.Generation, Reason: events.ReasonRetainedStateLost}
}

// passed refuses a passed deadline that is not due: of another phase than
// the sandbox's, or before the phase has lasted the deadline it names.
func passed(s *Sandbox, e *events.DeadlinePassed, now time.Time) error {
	d, err := time.ParseDuration(e.Deadline)
	if err != nil {
		return events.Errorf(events.CodeInvalidArgument, "sandbox %s: deadline %q: %v", s.ID, e.Deadline, err)
	}
	if e.Phase != s.Phase || now.Sub(s.Entered) < d {
		return events.Errorf(events.CodeFailedPrecondition, "sandbox %s: the %s deadline of %s is not due: it is %s since %s",
			s.ID, e.Phase, d, s.Phase, s.Entered.Format(time.RFC3339Nano))
	}
	return nil
}

// awaits says why a supervisor's report of generation gen must wait for
// the runner's record, "" when it need not: gen is the generation a start
// or a resume under way minted, and that saga's outcome is not recorded
// (no sandbox.started, or no sandbox.resumed, of gen). One fact, one
// writer: the driver's answer is the saga's to record (sandbox.started;
// the consumption and the restore, sagas/resume.go), what the supervisor
// saw is the supervisor's (supervisor.attached, sandbox.exited). A
// supervisor that reports before the saga heard the driver's answer (the
// workload runs before the driver's call returns) is taken after the
// saga's record, so the log always reads started, attached, and consumed,
// resumed, attached: never a ready sandbox that a late started follows,
// never a held reference under a ready sandbox (the table takes no
// consumption in ready), never an exit that moves the sandbox to error
// before the saga's record, which the table would then refuse and the saga
// drop. Should the saga never record (the driver never answered, the
// resume failed), the sandbox moves on (its deadline, the saga's other
// outcome) and the report is then refused for good, or taken, there.
func awaits(s *Sandbox, gen int64) string {
	if s.Generation != gen {
		return ""
	}
	switch {
	case s.Phase == events.PhaseStarting && s.Resuming && s.Restored != gen:
		return fmt.Sprintf("the resume of generation %d has no outcome recorded yet", gen)
	case (s.Phase == events.PhaseProvisioning || s.Phase == events.PhaseStarting) && !s.Resuming && s.Started != gen:
		return fmt.Sprintf("the start of generation %d has no outcome recorded yet", gen)
	}
	return ""
}

// errEarly marks the answer to a report that came before the record it
// waits for (awaits): ABORTED, to be sent again.
var errEarly = errors.New("early")

// early is e marked errEarly; its code and message stay.
func early(e *events.Error) *events.Error {
	e.Err = errEarly
	return e
}

// exportedHeld refuses a sandbox.retained_state_exported (issue 29) unless
// s is suspended on the state it names, held: a stale one (of a state
// consumed, discarded, invalidated or superseded since) or a forged one is
// never taken, by the aggregate (apply) as by the views
// (events.Restore.Refuses).
func exportedHeld(s *Sandbox, e *events.RetainedStateExported) error {
	if s.Phase != events.PhaseSuspended || s.RestoreRef == "" || e.RestoreRef != s.RestoreRef {
		return events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s: the retained state %q exported is not the one it holds", s.ID, s.Phase, e.RestoreRef)
	}
	return nil
}
