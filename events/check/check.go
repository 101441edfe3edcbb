// Package check reads sandboxes' event logs and reports every violation of
// the five invariants of CONTRACT §1, folding the phase view as it goes so
// that what any projection would show at any point of a replay is checked
// too. `torpor check` runs it over a live log; every test that produces a log
// runs it over that log.
package check

import (
	"context"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
)

// Violation is one breach of an invariant, at the event that shows it.
type Violation struct {
	SandboxID string `json:"sandbox_id"`
	Seq       uint64 `json:"seq"`
	// Invariant is the number of the invariant in CONTRACT §1 (1 to 5).
	Invariant int    `json:"invariant"`
	Message   string `json:"message"`
}

func (v Violation) String() string {
	return fmt.Sprintf("sandbox %s seq %d: invariant %d: %s", v.SandboxID, v.Seq, v.Invariant, v.Message)
}

// Options tune a check. The zero value checks invariants 1 to 4 and, for
// invariant 5, only that a passed deadline settles its phase.
type Options struct {
	// Deadline and Now make invariant 5 also check the end of the log: a
	// sandbox still in a transient phase that it entered more than
	// Deadline + Slack before Now is stuck.
	Deadline time.Duration
	Slack    time.Duration
	Now      time.Time
	// Refused, when set, is told of every event the check passes over:
	// one whose data does not decode, or that the lifecycle table refuses
	// in the phase the check folded from the events before it (forged, or
	// a writer's bug). The aggregate and every view pass over it too, so
	// it is no violation: it changes nothing, and is only counted.
	Refused func(env events.Envelope, err error)
}

// The invariants of CONTRACT §1, by number.
const (
	RetainedStateOnce   = 1 // a consumed or invalidated reference is never suspended on again
	ExitKept            = 2 // a terminal exit result is never overwritten
	GenerationsFenced   = 3 // each start or resume mints a new generation; older ones change nothing
	CommandsOnce        = 4 // every accepted command is in the log exactly once
	TransientsHaveAnEnd = 5 // every transient phase ends: a passed deadline settles it
)

// report is an event that speaks for one supervisor generation.
type report interface {
	SpeaksFor() int64
}

// sandbox is what the check keeps of one sandbox while it reads its log.
type sandbox struct {
	id      string
	refused func(env events.Envelope, err error)
	view    events.View
	ref     string          // the reference of the last suspension, held unless dead
	refGen  int64           // the generation that suspension retains
	dead    map[string]bool // references consumed, discarded or invalidated
	gen     int64           // the current generation
	top     int64           // the highest generation minted
	exited  map[int64]int   // exit code recorded per generation
	ids     map[string]bool
	intents map[string]bool // command id + intent type
	since   time.Time       // when the current phase was entered
	out     []Violation
}

func (s *sandbox) fail(seq uint64, inv int, format string, args ...any) {
	s.out = append(s.out, Violation{SandboxID: s.id, Seq: seq, Invariant: inv, Message: fmt.Sprintf(format, args...)})
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
		refused: o.Refused,
		dead:    map[string]bool{},
		exited:  map[int64]int{},
		ids:     map[string]bool{},
		intents: map[string]bool{},
	}
	for _, env := range envs {
		s.step(env)
	}
	if o.Deadline > 0 && !o.Now.IsZero() && s.view.Phase.Transient() {
		if age := o.Now.Sub(s.since); age > o.Deadline+o.Slack {
			s.fail(s.view.Seq, TransientsHaveAnEnd, "%s for %s, past the deadline of %s", s.view.Phase, age.Round(time.Millisecond), o.Deadline)
		}
	}
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
		s.fail(seq, CommandsOnce, "an event of sandbox %s in this log", env.SandboxID)
		return
	}
	if s.ids[env.ID] {
		s.fail(seq, CommandsOnce, "event id %s appended twice", env.ID)
	}
	s.ids[env.ID] = true
	// The phase comes from the table, never from the envelope's stamp: an
	// event the table refuses (or whose data does not decode) is passed
	// over by every reader and changes nothing here either.
	e, err := env.Decode()
	if err == nil {
		_, err = events.Next(s.view.Phase, env.Type)
	}
	if err != nil {
		if s.refused != nil {
			s.refused(env, err)
		}
		return
	}
	if env.CommandID != "" && events.Intent(env.Type) {
		k := env.CommandID + "\x00" + env.Type
		if s.intents[k] {
			s.fail(seq, CommandsOnce, "command %s appended %s twice", env.CommandID, env.Type)
		}
		s.intents[k] = true
	}
	if r, ok := e.(report); ok && r.SpeaksFor() != s.owner() {
		s.fail(seq, GenerationsFenced, "%s of generation %d recorded while generation %d is current", env.Type, r.SpeaksFor(), s.owner())
	}
	switch e := e.(type) {
	case *events.Created:
		s.gen, s.top = e.Generation, e.Generation
	case *events.StartRequested:
		s.mint(seq, env.Type, e.Generation)
	case *events.ResumeRequested:
		if e.RestoreRef == "" || e.RestoreRef != s.ref || s.dead[s.ref] {
			s.fail(seq, RetainedStateOnce, "resume of reference %q, which is not held", e.RestoreRef)
		}
		s.mint(seq, env.Type, e.Generation)
	case *events.Suspended:
		s.ref, s.refGen = e.RestoreRef, e.Generation // on a dead one: the phase check below says so
	case *events.RetainedStateConsumed:
		s.dead[e.RestoreRef] = true
	case *events.RetainedStateDiscarded:
		s.dead[e.RestoreRef] = true
	case *events.RetainedStateInvalidated:
		s.dead[e.RestoreRef] = true
	case *events.Exited:
		if code, ok := s.exited[e.Generation]; ok {
			s.fail(seq, ExitKept, "a second exit of generation %d (code %d after %d)", e.Generation, e.Code, code)
		}
		s.exited[e.Generation] = e.Code
	}
	before := s.view
	s.view.Fold(env)
	if s.view.Phase != before.Phase {
		s.since = env.Time
	}
	if before.ExitCode != nil && s.view.Generation == before.Generation &&
		(s.view.ExitCode == nil || *s.view.ExitCode != *before.ExitCode) {
		s.fail(seq, ExitKept, "the view's exit code %d of generation %d changed to %v", *before.ExitCode, before.Generation, s.view.ExitCode)
	}
	// The stamp is what the writer said the deadline left; the table
	// never leaves a transient phase on one, a writer's stamp may.
	if _, ok := e.(*events.DeadlinePassed); ok && (s.view.Phase.Transient() || env.Phase.Transient()) {
		s.fail(seq, TransientsHaveAnEnd, "a passed deadline left the sandbox %s", s.view.Phase)
	}
	if s.view.Phase == events.PhaseSuspended {
		switch {
		case s.ref == "":
			s.fail(seq, RetainedStateOnce, "suspended with no retained state")
		case s.dead[s.ref]:
			s.fail(seq, RetainedStateOnce, "suspended on reference %q, consumed or invalidated", s.ref)
		case !s.view.Restore.Held:
			s.fail(seq, RetainedStateOnce, "the view shows suspended without a retained state held")
		}
	}
}

// owner is the generation whose reports the sandbox takes now: the current
// one, except in suspended, where the retained workload speaks for the
// generation it was suspended at, even after a failed resume raised the
// current one (CONTRACT §1: its death is its sandbox's).
func (s *sandbox) owner() int64 {
	if s.view.Phase == events.PhaseSuspended && s.ref != "" && !s.dead[s.ref] && s.refGen != 0 {
		return s.refGen
	}
	return s.gen
}

// mint checks that an intent mints a new generation, and makes it current.
func (s *sandbox) mint(seq uint64, typ string, gen int64) {
	if gen <= s.top {
		s.fail(seq, GenerationsFenced, "%s mints generation %d, not above %d", typ, gen, s.top)
	}
	s.gen, s.top = gen, max(s.top, gen)
}
