package gateway

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/services/compute"
)

// logged is an aggregate and the log it was folded from, as the service
// would have appended it: each decision applied to a copy and kept only if
// the table takes all of it (an append is all or nothing).
type logged struct {
	sb   *Sandbox
	log  []events.Envelope
	now  time.Time
	next int // command ids
}

// append folds evs as one append of actor's, or refuses them all.
func (l *logged) append(t *rapid.T, cmd string, evs []events.Event) bool {
	next := l.sb.clone()
	envs := make([]events.Envelope, len(evs))
	for i, e := range evs {
		env, err := events.NewEnvelope(sid, e, events.Meta{CommandID: cmd}, l.now)
		if err != nil {
			t.Fatal(err)
		}
		env.Seq = uint64(len(l.log) + i + 1)
		if err := next.apply(env); err != nil {
			return false
		}
		env.Phase = next.Phase
		envs[i] = env
	}
	l.sb = next
	l.log = append(l.log, envs...)
	return true
}

// action is one thing that may happen to a sandbox next: a command (its
// verb set) or a report (its events, to be fenced and judged).
type action struct {
	name string
	cmd  Command
	evs  []events.Event
}

// candidates is every command, and every report a driver, a supervisor or
// a deadline could make now: of the current generation and the held
// reference, and of the ones before and after, and of another reference.
func candidates(l *logged, refs int) []action {
	var out []action
	for _, verb := range Verbs {
		for _, fb := range []bool{false, true} {
			out = append(out, action{name: verb, cmd: Command{Verb: verb, ID: sid, RestartIfRestoreFails: fb,
				Create: events.CreateRequest{Name: "a", Driver: "sim"}}})
		}
	}
	for _, gen := range []int64{l.sb.Generation, l.sb.Generation - 1, l.sb.Generation + 1} {
		reports := [][]events.Event{
			{&events.Suspended{Generation: gen, RestoreRef: fmt.Sprintf("ref-%d", refs+1)}},
			{&events.SuspendRejected{Generation: gen, Reason: events.ReasonSuspendRejected}},
			{&events.ResumeFailed{Generation: gen}},
			{&events.Resumed{Generation: gen, Outcome: events.OutcomeRestored}},
			{&events.Exited{Generation: gen, Code: 3}},
			{&events.Started{Generation: gen}},
			{&events.StartFailed{Generation: gen}},
			{&events.Stopped{Generation: gen}},
			{&events.StopRejected{Generation: gen}},
			{&events.ResourceLost{Generation: gen}},
			{&events.SupervisorAttached{Generation: gen}},
			{&events.SupervisorDetached{Generation: gen}},
			{&events.DeadlinePassed{Phase: l.sb.Phase, Deadline: "1m0s"}},
			{&events.SuspendRejected{Generation: gen, Reason: events.ReasonDeadlineExceeded}, &events.DeadlinePassed{Phase: l.sb.Phase, Deadline: "1m0s"}},
			{&events.ResumeFailed{Generation: gen}, &events.DeadlinePassed{Phase: l.sb.Phase, Deadline: "1m0s"}},
		}
		for _, ref := range []string{l.sb.RestoreRef, fmt.Sprintf("ref-%d", refs)} {
			reports = append(reports,
				[]events.Event{&events.RetainedStateConsumed{Generation: gen, RestoreRef: ref}},
				[]events.Event{&events.RetainedStateConsumed{Generation: gen, RestoreRef: ref}, &events.Stopped{Generation: gen, Reason: events.ReasonRetainedStateLost}},
				[]events.Event{&events.RetainedStateConsumed{Generation: gen, RestoreRef: ref}, &events.StartRequested{Generation: gen + 1, Fallback: true}},
				[]events.Event{&events.RetainedStateInvalidated{RestoreRef: ref}, &events.Deleted{}},
			)
		}
		for _, evs := range reports {
			out = append(out, action{name: evs[0].Type(), evs: evs})
		}
	}
	out = append(out, action{name: events.TypeDeleted, evs: []events.Event{&events.Deleted{}}})
	return out
}

// outcome is what action a appends on l now (nil: nothing, or refused).
func (l *logged) outcome(a action, caps compute.Capabilities) []events.Event {
	if a.cmd.Verb != "" {
		evs, err := decide(l.sb, a.cmd, caps)
		if err != nil {
			return nil
		}
		return evs
	}
	evs := a.evs
	if a, ok := evs[0].(*events.SupervisorAttached); ok && l.sb.Exists() && awaits(l.sb, a.Generation) != "" {
		return nil // held until the resume saga's record (recordReport)
	}
	evs, err := reported(l.sb, evs, l.now)
	if err != nil {
		return nil
	}
	if to, ok := l.accepted(evs); ok && to == events.PhaseError && deadline(evs) {
		// A deadline that ends the sandbox in error asks for the driver's
		// clean-up in the same append, as the deadline saga writes it
		// (sagas/deadline.go; the checker's clean-up rule).
		evs = append(evs, &events.CleanupRequested{Generation: l.sb.Generation, Action: events.CleanupStop})
	}
	return evs
}

// deadline says whether evs record a passed deadline.
func deadline(evs []events.Event) bool {
	for _, e := range evs {
		if _, ok := e.(*events.DeadlinePassed); ok {
			return true
		}
	}
	return false
}

// weight makes the walk go deep: what moves the phase on is drawn most,
// a fact that keeps it less, and what ends a sandbox (delete, an exit, a
// failure into error) rarely, or every walk would be over in a few steps.
func weight(a action, from, to events.Phase) int {
	switch a.name {
	case VerbDelete, events.TypeDeleted, events.TypeRetainedStateInvalidated:
		return 1
	case events.TypeExited, events.TypeStartFailed, events.TypeResourceLost, events.TypeDeadlinePassed:
		return 5
	case events.TypeRetainedStateConsumed:
		return 100 // keeps the phase, but is the point of no return
	}
	if to == from {
		return 10
	}
	return 100
}

// take is an action the sandbox takes now, with its weight.
type take struct {
	i, w int
}

// weighted draws one of takes by weight.
func weighted(r *rand.Rand, takes []take) int {
	total := 0
	for _, t := range takes {
		total += t.w
	}
	n := r.IntN(total)
	for _, t := range takes {
		if n -= t.w; n < 0 {
			return t.i
		}
	}
	return takes[len(takes)-1].i
}

// accepted returns the phase evs leave l in, and whether the table takes
// them there now.
func (l *logged) accepted(evs []events.Event) (events.Phase, bool) {
	if len(evs) == 0 {
		return "", false
	}
	p := l.sb.Phase
	for _, e := range evs {
		var err error
		if p, err = Next(p, e.Type()); err != nil {
			return "", false
		}
	}
	return p, true
}

// TestNoSequenceBreaksTheInvariants: random commands and random reports
// (outcomes of any generation, supervisor reports, passed deadlines, driver
// answers that lie), decided and judged by the aggregate as the service does,
// never make a log that breaks an invariant of CONTRACT §1 (the checker folds
// the phase view as it goes). Each step mostly picks among what the sandbox
// would take now, so the walk reaches deep into the lifecycle; now and then
// it tries anything, to see refusals append nothing. rapid draws the walk's
// length and the seed of its steps (its own integers lean to their ends, which
// would make every walk take the same few steps). Three rounds of rapid's
// checks (300 walks by default, -rapid.checks sets a round's): a broken guard
// of the aggregate was found within 40 to 420 walks when tried.
func TestNoSequenceBreaksTheInvariants(t *testing.T) {
	for round := 0; round < 3; round++ {
		rapid.Check(t, walk)
	}
}

// walk is one random life of a sandbox; see TestNoSequenceBreaksTheInvariants.
func walk(t *rapid.T) {
	l := &logged{sb: &Sandbox{ID: sid}, now: time.Unix(1_700_000_000, 0)}
	r := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 0))
	caps := compute.Capabilities{Suspend: r.IntN(10) != 0}
	refs := 0
	var lastCmd string
	steps := rapid.IntRange(1, 120).Draw(t, "steps")
	for i := 0; i < steps; i++ {
		l.now = l.now.Add(time.Duration(r.IntN(120)) * time.Second)
		all := candidates(l, refs)
		var takes []take
		for j, a := range all {
			if to, ok := l.accepted(l.outcome(a, caps)); ok {
				takes = append(takes, take{i: j, w: weight(a, l.sb.Phase, to)})
			}
		}
		var a action
		switch {
		case r.IntN(10) == 0 || len(takes) == 0:
			a = all[r.IntN(len(all))]
		case lastCmd != "" && r.IntN(10) == 0:
			a = action{name: "retry", cmd: Command{Verb: lastCmd, ID: sid, CommandID: fmt.Sprintf("cmd-%d", l.next)}}
		default:
			a = all[weighted(r, takes)]
		}
		cmd := ""
		if a.cmd.Verb != "" {
			if a.cmd.CommandID == "" {
				l.next++
				a.cmd.CommandID = fmt.Sprintf("cmd-%d", l.next)
			}
			cmd, lastCmd = a.cmd.CommandID, a.cmd.Verb
		}
		evs := l.outcome(a, caps)
		if len(evs) == 0 || !l.append(t, cmd, evs) {
			continue
		}
		if _, ok := evs[0].(*events.Suspended); ok {
			refs++
		}
	}
	if vs := check.Log(l.log, check.Options{}); len(vs) > 0 {
		for _, e := range l.log {
			t.Logf("%d %s %s %s", e.Seq, e.Type, e.Phase, e.Data)
		}
		t.Fatalf("violations: %v", vs)
	}
}
