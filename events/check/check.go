// Package check reads sandboxes' event logs and reports every violation of
// the five invariants of CONTRACT §1 and of its table of phases. It judges
// independently of the service: it derives each phase from the events
// alone through its own statement of CONTRACT §1's table (contract.go),
// never trusting an envelope's phase stamp (a stamp that disagrees is a
// violation), and folds the phase view as the views do, so that what any
// projection would show at any point of a replay is checked against the
// events too. `torpor check` runs it over a live log; every test that
// produces a log runs it over that log.
package check

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/torpor/torpor/events"
)

// Violation is one breach of an invariant, at the event that shows it.
type Violation struct {
	SandboxID string `json:"sandbox_id"`
	Seq       uint64 `json:"seq"`
	// Invariant is the number of the invariant in CONTRACT §1 (1 to 5), or
	// 0 for a breach of §1's table of phases that is none of the five
	// (Lifecycle).
	Invariant int `json:"invariant"`
	// Rule names the check that found it (the Rule* constants).
	Rule    string `json:"rule,omitempty"`
	Message string `json:"message"`
}

func (v Violation) String() string {
	if v.Invariant == Lifecycle {
		return fmt.Sprintf("sandbox %s seq %d: lifecycle: %s", v.SandboxID, v.Seq, v.Message)
	}
	return fmt.Sprintf("sandbox %s seq %d: invariant %d: %s", v.SandboxID, v.Seq, v.Invariant, v.Message)
}

// Options tune a check. The zero value checks every rule but the ones
// that need a clock: a transient stay is then judged only when it ended.
type Options struct {
	// Deadline is the server's deadline of transient phases (serve
	// --deadline, GET /v1/server): a transient stay that lasted longer
	// than Deadline + Slack, ended or not (at Now), breaks invariant 5, and
	// so does a deadline's clean-up with no outcome that long after it was
	// asked for. Zero leaves stays unjudged.
	Deadline time.Duration
	Slack    time.Duration
	Now      time.Time
	// CleanupUnrecorded says the log was written before the writer
	// recorded a passed deadline's clean-up of the driver
	// (TypeCleanupRequested, issue 24's hole 7): a deadline that ends a
	// phase in error with no clean-up asked for after it is then not
	// judged. Off, as every writer of this build records the intent with
	// the deadline (sagas/deadline.go), such a deadline is a violation; the
	// opt-out is only for older logs (torpor check --cleanup-unrecorded),
	// whose every deadline in error would otherwise be reported.
	CleanupUnrecorded bool
	// Refused, when set, is told of every event the check passes over:
	// one whose data does not decode, or that CONTRACT §1 and the views'
	// lifecycle table both refuse in the phase the events before it lead
	// to (forged, or a writer's bug). The aggregate and every view pass
	// over it too, so it is no violation: it changes nothing, and is only
	// counted.
	Refused func(env events.Envelope, err error)
}

// The invariants of CONTRACT §1, by number, and 0 for the table of phases.
const (
	Lifecycle           = 0 // the table of phases, error and deleted terminal, the phase stamps
	RetainedStateOnce   = 1 // a consumed or invalidated reference is never suspended on again
	ExitKept            = 2 // a terminal exit result is never overwritten
	GenerationsFenced   = 3 // each start or resume mints a new generation; older ones change nothing
	CommandsOnce        = 4 // every accepted command is in the log exactly once
	TransientsHaveAnEnd = 5 // every transient phase ends: a passed deadline settles it
)

// The rules of the check, as Violation.Rule names them.
const (
	RuleTable    = "table"    // an event CONTRACT §1 does not take where the views do, or the other way round
	RuleStamp    = "stamp"    // an envelope's phase is not the one the events lead to
	RuleTerminal = "terminal" // an event moves error (other than a delete) or deleted
	RuleRetained = "retained" // invariant 1
	RuleExit     = "exit"     // invariant 2
	RuleFenced   = "fenced"   // invariant 3
	RuleOnce     = "once"     // an event or intent appended twice
	RuleOutcome  = "outcome"  // an intent with more than one outcome
	RuleSettles  = "settles"  // a passed deadline that leaves a transient phase
	RuleStay     = "stay"     // a transient stay longer than the deadline
	RuleCleanup  = "cleanup"  // a deadline's clean-up never done
	RuleExpiry   = "expiry"   // a ttl expiry not at its time (moved by the stays in suspended when it pauses), or the views' expires_at not it
	RuleRefusal  = "refusal"  // issue 29: a target's refusal of a resume from another node than the resume's target, or the views not saying it
	RuleMovable  = "movable"  // issue 29: an export ahead of a state not held taken by the views, or the views' restore.movable not what the events say
)

// The deadline's clean-up of the driver, as the sagas record it (issue
// 24, hole 7; sagas/cleanup.go): the intent, appended with the
// deadline_passed that ended a phase in error, and the driver's
// confirmation. The check reads them by type, so that a log is judged
// the same whichever build decodes it.
const (
	TypeCleanupRequested = "sandbox.cleanup_requested"
	TypeCleanedUp        = "sandbox.cleaned_up"
)

// report is an event that speaks for one supervisor generation.
type report interface {
	SpeaksFor() int64
}

// stay is a transient phase a sandbox entered.
type stay struct {
	phase events.Phase
	seq   uint64
	at    time.Time
}

// intent is a command's intent seen in the log.
type intent struct {
	typ      string
	seq      uint64
	outcomes int
	consumed int // retained_state_consumed recorded for it (a resume)
}

// sandbox is what the check keeps of one sandbox while it reads its log.
type sandbox struct {
	id   string
	o    Options
	life life        // the phase by CONTRACT §1, from the events alone
	view events.View // what a projection shows: folded by the views' table
	ref  string      // the reference of the last suspension, held unless dead
	// refGen is the generation that owns the retained state: the one
	// reports are judged against in suspended.
	refGen   int64
	dead     map[string]bool // references consumed, discarded or invalidated
	gen      int64           // the generation reports must speak for
	top      int64           // the highest generation minted
	exited   map[int64]int   // exit code recorded per generation
	exit     *int            // the exit code of the current run, once recorded
	ids      map[string]bool
	intents  map[string]*intent // command id + intent type
	last     *intent            // the newest intent
	stay     *stay              // the transient stay under way
	cleanups []stay             // clean-ups asked for and not confirmed
	owed     uint64             // a deadline that ended in error, its clean-up not asked for yet
	// ttlAt is the sandbox's ttl as the events say: created's expires_at,
	// moved later by each stay in suspended that ended when ttlPauses
	// (create's ttl_pauses_while_suspended); pausedAt is the entry into
	// the stay under way.
	ttlAt     time.Time
	ttlPauses bool
	pausedAt  time.Time
	// node is the sandbox's node (created's, then a consumption's on
	// another), target the node the open resume runs on (issue 29).
	node, target string
	// movable is the reference whose export ahead is recorded (issue 29),
	// and movableBytes its size: movable while it is the state held.
	movable      string
	movableBytes int64
	out          []Violation
}

func (s *sandbox) fail(seq uint64, inv int, rule, format string, args ...any) {
	s.out = append(s.out, Violation{SandboxID: s.id, Seq: seq, Invariant: inv, Rule: rule, Message: fmt.Sprintf(format, args...)})
}

// Log checks the events of one sandbox, in the order of the log (foreign
// messages already left out, as every store does), and returns the
// violations found, in order.
func Log(envs []events.Envelope, o Options) []Violation {
	if len(envs) == 0 {
		return nil
	}
	s := &sandbox{
		id:      envs[0].SandboxID,
		o:       o,
		dead:    map[string]bool{},
		exited:  map[int64]int{},
		ids:     map[string]bool{},
		intents: map[string]*intent{},
	}
	for _, env := range envs {
		s.step(env)
	}
	s.end()
	return s.out
}

// All checks a whole log, every sandbox's events interleaved in the order
// of the log, sandbox by sandbox in the order they first appear.
func All(envs []events.Envelope, o Options) []Violation {
	bySandbox := map[string][]events.Envelope{}
	var order []string
	for _, e := range envs {
		if _, ok := bySandbox[e.SandboxID]; !ok {
			order = append(order, e.SandboxID)
		}
		bySandbox[e.SandboxID] = append(bySandbox[e.SandboxID], e)
	}
	var out []Violation
	for _, id := range order {
		out = append(out, Log(bySandbox[id], o)...)
	}
	return out
}

// Replayer reads a whole log in order (jsstore.Store satisfies it).
type Replayer interface {
	Replay(ctx context.Context, from uint64, h func([]events.Envelope) error) (uint64, error)
}

// Replay checks the whole log src holds now.
func Replay(ctx context.Context, src Replayer, o Options) ([]Violation, error) {
	var log []events.Envelope
	if _, err := src.Replay(ctx, 0, func(envs []events.Envelope) error {
		log = append(log, envs...)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("check: read the log: %w", err)
	}
	return All(log, o), nil
}

// step checks one event and folds it.
func (s *sandbox) step(env events.Envelope) {
	seq := env.Seq
	if env.SandboxID != s.id {
		s.fail(seq, CommandsOnce, RuleOnce, "an event of sandbox %s in this log", env.SandboxID)
		return
	}
	if s.ids[env.ID] {
		s.fail(seq, CommandsOnce, RuleOnce, "event id %s appended twice", env.ID)
	}
	s.ids[env.ID] = true
	switch env.Type {
	case TypeCleanupRequested:
		s.cleanups = append(s.cleanups, stay{phase: s.life.phase, seq: seq, at: env.Time})
		s.owed = 0
		return
	case TypeCleanedUp:
		if len(s.cleanups) > 0 {
			s.cleanups = s.cleanups[1:]
		}
		return
	}
	e, err := env.Decode()
	if err != nil {
		s.refuse(env, err)
		return
	}
	// The phase comes from CONTRACT §1 (contract.go), never from the
	// envelope's stamp; the views' fold, by the lifecycle table the
	// gateway decides with, is checked against it.
	from := s.life.phase
	taken, verr := s.view.Apply(env)
	if verr == nil && !taken {
		verr = fmt.Errorf("seq %d at or below the view's %d", seq, s.view.Seq)
	}
	to, why := s.life.next(e)
	if x, ok := e.(*events.RetainedStateExported); ok && to != "" && (x.RestoreRef == "" || x.RestoreRef != s.ref || s.dead[s.ref]) {
		to, why = "", fmt.Sprintf("an export ahead of reference %q, which is not held", x.RestoreRef)
	}
	switch {
	case to == "" && verr != nil:
		// Refused by both: every reader passes over it (forged, or a
		// writer's bug the aggregate refused too).
		s.refuse(env, fmt.Errorf("%w: %s", verr, why))
		return
	case to == "":
		rule := RuleTable
		if from.Terminal() {
			rule = RuleTerminal
		}
		// A restore failed after the consumption and back in suspended is
		// invariant 1's, reported below; the rest is the table's.
		if _, ok := e.(*events.RetainedStateExported); ok {
			rule = RuleMovable
		}
		if _, ok := e.(*events.ResumeFailed); !ok || s.view.Phase != events.PhaseSuspended {
			s.fail(seq, Lifecycle, rule, "%s in %s: %s; the views took it, to %s", env.Type, phaseName(from), why, s.view.Phase)
		}
		to = s.view.Phase // follow the log as the views read it
	case verr != nil:
		s.fail(seq, Lifecycle, RuleTable, "%s in %s: CONTRACT §1 moves to %s; the views' table refuses it", env.Type, phaseName(from), to)
		return // passed over by every reader: followed no further
	case to != s.view.Phase:
		s.fail(seq, Lifecycle, RuleTable, "%s in %s: CONTRACT §1 moves to %s, the views' table to %s", env.Type, phaseName(from), to, s.view.Phase)
		to = s.view.Phase
	}
	if env.Phase != "" && env.Phase != to {
		rule := RuleStamp
		if from.Terminal() {
			rule = RuleTerminal
		}
		s.fail(seq, Lifecycle, rule, "%s stamped %s; the events lead to %s", env.Type, env.Phase, to)
	}
	if r, ok := e.(report); ok && r.SpeaksFor() != s.gen {
		s.fail(seq, GenerationsFenced, RuleFenced, "%s of generation %d recorded while generation %d is current", env.Type, r.SpeaksFor(), s.gen)
	}
	s.outcome(seq, env, e)
	s.life.apply(e, to)
	s.effects(seq, env, e, to)
	s.expiry(env, e, from, to)
	s.stays(env, from, to)
	if d, ok := e.(*events.DeadlinePassed); ok {
		// The stamp is what the writer said the deadline left.
		if to.Transient() || env.Phase.Transient() {
			s.fail(seq, TransientsHaveAnEnd, RuleSettles, "a passed deadline left the sandbox %s", to)
		}
		switch d.Phase {
		case provisioning, starting, stopping, deleting:
			if to == errored {
				s.owed = seq // CONTRACT §1: the driver is told to clean up
			}
		}
	}
	s.views(seq, to)
}

func phaseName(p events.Phase) string {
	if p == none {
		return "(none)"
	}
	return string(p)
}

func (s *sandbox) refuse(env events.Envelope, err error) {
	if s.o.Refused != nil {
		s.o.Refused(env, err)
	}
}

// outcomeOf lists, for each intent type, the events that answer it: an
// intent has at most one.
var outcomeOf = map[string][]string{
	events.TypeCreated:          {events.TypeStarted, events.TypeStartFailed},
	events.TypeStartRequested:   {events.TypeStarted, events.TypeStartFailed},
	events.TypeStopRequested:    {events.TypeStopped, events.TypeStopRejected, events.TypeResourceLost},
	events.TypeSuspendRequested: {events.TypeSuspended, events.TypeSuspendRejected, events.TypeResourceLost},
	events.TypeResumeRequested: {events.TypeResumed, events.TypeResumeFailed, events.TypeResourceLost,
		events.TypeStopped, events.TypeStartRequested}, // a strict restore lost, or the cold fallback
	events.TypeDeleteRequested: {events.TypeDeleted},
}

// outcome checks that each intent (command id + intent type) is in the
// log once and gets at most one outcome, and one consumption of the
// retained state for a resume. Events without a command id answer none.
func (s *sandbox) outcome(seq uint64, env events.Envelope, e events.Event) {
	if env.CommandID == "" {
		return
	}
	answers := !events.Intent(env.Type)
	if sr, ok := e.(*events.StartRequested); ok && sr.Fallback {
		answers = true
	}
	var in *intent
	for typ, outs := range outcomeOf {
		if i := s.intents[env.CommandID+"\x00"+typ]; i != nil && (in == nil || i.seq > in.seq) &&
			(slices.Contains(outs, env.Type) && answers || env.Type == events.TypeRetainedStateConsumed && typ == events.TypeResumeRequested) {
			in = i
		}
	}
	switch {
	case in == nil:
	case env.Type == events.TypeRetainedStateConsumed:
		if in.consumed++; in.consumed > 1 {
			s.fail(seq, CommandsOnce, RuleOutcome, "command %s's %s consumed the retained state a second time", env.CommandID, in.typ)
		}
	default:
		if in.outcomes++; in.outcomes > 1 {
			s.fail(seq, CommandsOnce, RuleOutcome, "command %s's %s (seq %d) answered a second time, by %s", env.CommandID, in.typ, in.seq, env.Type)
		}
	}
	if events.Intent(env.Type) {
		k := env.CommandID + "\x00" + env.Type
		if s.intents[k] != nil {
			s.fail(seq, CommandsOnce, RuleOnce, "command %s appended %s twice", env.CommandID, env.Type)
			return
		}
		s.intents[k] = &intent{typ: env.Type, seq: seq}
	}
}

// effects keeps the generations, the retained state and the exit code.
func (s *sandbox) effects(seq uint64, env events.Envelope, e events.Event, to events.Phase) {
	switch e := e.(type) {
	case *events.Created:
		s.gen, s.top = e.Generation, e.Generation
		s.node = e.Node
	case *events.StartRequested:
		s.mint(seq, env.Type, e.Generation)
		s.exit = nil // a new run
	case *events.ResumeRequested:
		if e.RestoreRef == "" || e.RestoreRef != s.ref || s.dead[s.ref] {
			s.fail(seq, RetainedStateOnce, RuleRetained, "resume of reference %q, which is not held", e.RestoreRef)
		}
		s.mint(seq, env.Type, e.Generation)
		s.target = cmp.Or(e.Node, s.node)
	case *events.Suspended:
		s.ref, s.refGen = e.RestoreRef, e.Generation // on a dead one: views says so
	case *events.RetainedStateExported:
		s.movable, s.movableBytes = e.RestoreRef, e.Bytes
	case *events.RetainedStateConsumed:
		s.dead[e.RestoreRef] = true
		s.node = cmp.Or(e.Node, s.node)
	case *events.RetainedStateDiscarded:
		s.dead[e.RestoreRef] = true
	case *events.RetainedStateInvalidated:
		s.dead[e.RestoreRef] = true
	case *events.ResumeFailed:
		if to == suspended {
			// Reports in suspended are judged against the generation that
			// owns the retained state (issue 24, hole 5).
			s.gen = s.refGen
		}
		s.refusal(seq, e)
	case *events.Exited:
		if code, ok := s.exited[e.Generation]; ok {
			s.fail(seq, ExitKept, RuleExit, "a second exit of generation %d (code %d after %d)", e.Generation, e.Code, code)
		}
		s.exited[e.Generation] = e.Code
		if s.exit == nil {
			code := e.Code
			s.exit = &code
		}
	}
}

// refusal judges a resume's failure that says its target refused (issue
// 29): only the node the resume ran on refuses it, and the views show the
// refusal's reason. (That nothing was consumed before it is the table's:
// a failure after the consumption is never suspended again.)
func (s *sandbox) refusal(seq uint64, e *events.ResumeFailed) {
	if e.Reason != events.ReasonCannotRestore {
		return
	}
	if e.Node != s.target {
		s.fail(seq, Lifecycle, RuleRefusal, "a refusal by node %q of a resume on node %q", e.Node, s.target)
	}
	if s.view.Reason != e.Reason {
		s.fail(seq, Lifecycle, RuleRefusal, "the views show reason %q after a refusal (%s)", s.view.Reason, e.Reason)
	}
}

// expiry keeps the sandbox's ttl and judges a ttl expiry against it (issue
// 27): at it, recorded no earlier, never while suspended when it pauses.
func (s *sandbox) expiry(env events.Envelope, e events.Event, from, to events.Phase) {
	switch e := e.(type) {
	case *events.Created:
		s.ttlAt, s.ttlPauses = e.ExpiresAt, e.TTLPausesWhileSuspended && !e.ExpiresAt.IsZero()
	case *events.Expired:
		if e.Policy != events.ExpiryTTL {
			break
		}
		switch {
		case s.ttlAt.IsZero():
			s.fail(env.Seq, Lifecycle, RuleExpiry, "a ttl expiry of a sandbox without a ttl")
		case s.ttlPauses && from == suspended:
			s.fail(env.Seq, Lifecycle, RuleExpiry, "a ttl expiry while suspended, where its ttl pauses")
		case !e.ExpiresAt.Equal(s.ttlAt):
			s.fail(env.Seq, Lifecycle, RuleExpiry, "a ttl expiry at %s; its ttl is %s", e.ExpiresAt.Format(time.RFC3339Nano), s.ttlAt.Format(time.RFC3339Nano))
		case env.Time.Before(s.ttlAt):
			s.fail(env.Seq, Lifecycle, RuleExpiry, "a ttl expiry recorded at %s, before its ttl %s", env.Time.Format(time.RFC3339Nano), s.ttlAt.Format(time.RFC3339Nano))
		}
	}
	if !s.ttlPauses {
		return
	}
	switch {
	case from != suspended && to == suspended:
		s.pausedAt = env.Time
	case from == suspended && to != suspended && !s.pausedAt.IsZero():
		if env.Time.After(s.pausedAt) {
			s.ttlAt = s.ttlAt.Add(env.Time.Sub(s.pausedAt))
		}
		s.pausedAt = time.Time{}
	}
}

// views checks what a projection shows after the event against what the
// events say: the exit code kept, no reference advertised once dead, the
// ttl and its pause.
func (s *sandbox) views(seq uint64, to events.Phase) {
	v := s.view
	if paused := s.ttlPauses && to == suspended; !v.ExpiresAt.Equal(s.ttlAt) || v.ExpiryPaused != paused {
		s.fail(seq, Lifecycle, RuleExpiry, "the views show expires_at %s (paused %v) where its ttl is %s (paused %v)",
			v.ExpiresAt.Format(time.RFC3339Nano), v.ExpiryPaused, s.ttlAt.Format(time.RFC3339Nano), paused)
	}
	if s.exit != nil && (v.ExitCode == nil || *v.ExitCode != *s.exit) {
		s.fail(seq, ExitKept, RuleExit, "the views show exit code %s where %d was recorded", code(v.ExitCode), *s.exit)
	}
	held := s.ref != "" && !s.dead[s.ref] && s.movable == s.ref
	if v.Restore.Movable != held || held && v.Restore.MovableBytes != s.movableBytes {
		s.fail(seq, Lifecycle, RuleMovable, "the views show movable %v (%d bytes) where the events say %v (%d bytes)",
			v.Restore.Movable, v.Restore.MovableBytes, held, s.movableBytes)
	}
	if to == suspended || v.Phase == suspended {
		switch {
		case s.ref == "":
			s.fail(seq, RetainedStateOnce, RuleRetained, "suspended with no retained state")
		case s.dead[s.ref]:
			s.fail(seq, RetainedStateOnce, RuleRetained, "suspended on reference %q, consumed or invalidated", s.ref)
		case !v.Restore.Held:
			s.fail(seq, RetainedStateOnce, RuleRetained, "the view shows suspended without a retained state held")
		}
		return
	}
	if v.Restore.Held && s.ref != "" && s.dead[s.ref] {
		s.fail(seq, RetainedStateOnce, RuleRetained, "the view shows reference %q held after it was consumed or invalidated", s.ref)
	}
}

func code(c *int) string {
	if c == nil {
		return "none"
	}
	return fmt.Sprint(*c)
}

// stays follows the sandbox in and out of transient phases: an intent
// enters its phase anew (a fallback start after a failed restore).
func (s *sandbox) stays(env events.Envelope, from, to events.Phase) {
	entered := to.Transient() && (from != to || events.Intent(env.Type))
	if s.stay != nil && (!to.Transient() || entered) {
		if d := env.Time.Sub(s.stay.at); s.o.Deadline > 0 && d > s.o.Deadline+s.o.Slack {
			s.fail(env.Seq, TransientsHaveAnEnd, RuleStay, "%s from seq %d lasted %s, past the deadline of %s", s.stay.phase, s.stay.seq, d.Round(time.Millisecond), s.o.Deadline)
		}
		s.stay = nil
	}
	if entered {
		s.stay = &stay{phase: to, seq: env.Seq, at: env.Time}
	}
}

// end judges what the log leaves open: a transient stay and a clean-up
// not done, against the clock; a clean-up owed and never asked for.
func (s *sandbox) end() {
	if !s.o.CleanupUnrecorded && s.owed != 0 {
		s.fail(s.owed, TransientsHaveAnEnd, RuleCleanup, "the deadline ended the sandbox in error; the driver's clean-up was never asked for")
	}
	if s.o.Deadline <= 0 || s.o.Now.IsZero() {
		return
	}
	limit := s.o.Deadline + s.o.Slack
	if s.stay != nil {
		if age := s.o.Now.Sub(s.stay.at); age > limit {
			s.fail(s.stay.seq, TransientsHaveAnEnd, RuleStay, "%s for %s, past the deadline of %s", s.stay.phase, age.Round(time.Millisecond), s.o.Deadline)
		}
	}
	for _, c := range s.cleanups {
		if age := s.o.Now.Sub(c.at); age > limit {
			s.fail(c.seq, TransientsHaveAnEnd, RuleCleanup, "the deadline's clean-up asked for %s ago has no outcome", age.Round(time.Millisecond))
		}
	}
}

// mint checks that an intent mints a new generation, and makes it current.
func (s *sandbox) mint(seq uint64, typ string, gen int64) {
	if gen <= s.top {
		s.fail(seq, GenerationsFenced, RuleFenced, "%s mints generation %d, not above %d", typ, gen, s.top)
	}
	s.gen, s.top = gen, max(s.top, gen)
}
