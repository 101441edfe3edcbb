package sagas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Deadlines (CONTRACT §1, invariant 5): every transient phase ends within
// Config.Deadline of the event that entered it. When it has not, the runner
// asks the driver what is true (compute.Observer; a driver without it knows
// nothing) and records, in one append, what that makes of the phase:
//
//   provisioning, starting (cold, or a resume whose state was consumed): no supervisor attached
//     observed exited        → exited{code} (error, the exit code kept)
//     observed running, and the deadline passed while the service was down → wait Config.Grace from the
//                              runner's start for the supervisor's attach, retried across the restart, then as below
//     observed running, the saga's outcome not recorded (the driver's answer never came)
//                            → what the driver's answer would have said, as the saga records it: started{generation},
//                              or for a resume retained_state_consumed (if held) + resumed{restored}; then wait
//                              Config.Grace for the supervisor, whose attach the gateway holds until that record
//                              (one writer per fact), then as below
//     otherwise              → deadline_passed (error, DeadlineExceeded) + cleanup_requested{stop}: driver.Stop cleans up
//                              (after a consumption the driver proved: retained_state_consumed first)
//   starting (a resume, the retained state held in the log)
//     a resume on another node, the target observed running it or having consumed the state for it
//                            → retained_state_consumed{node: the target} + deadline_passed (error), or + exited{code}
//                              when observed exited, or + resumed{restored} and the attach's grace as above when
//                              observed running it; then the target's driver.Stop cleans up (the restore ran there
//                              while its answer was lost); else as below, observed on the sandbox's node
//     a resume on another node, the target cannot tell (no answer to Observe): the state held on the sandbox's
//     node proves nothing (the target may have consumed the moved copy), so below ends in error, unless this
//     runner knows that every Resume it sent the target for this intent reached no driver
//     (compute.ErrNotDelivered: NATS's no responders, or never sent) and none other may have: the target then
//     consumed nothing, and below decides as for a resume on the sandbox's node (frozen behind the reference →
//     suspended; the exported copy stays with the held state, as after a refusal: a later restore, discard or
//     delete on that node removes it). That knowledge is the runner's memory (reach, resume.go), kept for
//     intents appended after it first read the log to its head: after a restart (or a takeover) it is gone,
//     and such a deadline ends in error
//     observed gone          → resource_lost (error)
//     observed running it, exited, or the state consumed for it (Observation.ConsumedGeneration, or the
//     reference as Observation.Consumed)
//                            → as above: the point of no return passed while the answer was lost (running it:
//                              the restore ran, recorded as the saga would, and the attach waited for)
//     observed frozen behind the reference (and, for a resume on another node, the target said it consumed
//     nothing, or no resume ever reached it)
//                            → resume_failed + deadline_passed (suspended, retryable, DeadlineExceeded)
//     otherwise (nothing says the state is held) → deadline_passed (error); then driver.Stop cleans up; a
//                              reference never consumed is invalidated by the delete
//   suspending
//     observed frozen        → suspended{the driver's reference}: the suspension succeeded after all
//     observed running       → suspend_rejected{DeadlineExceeded} + deadline_passed (ready, forwards untouched)
//     observed exited        → exited{code} (error, the exit code kept)
//     observed gone          → resource_lost (error)
//     otherwise              → deadline_passed (error)
//   (a suspension the driver answers later, or is observed to have made when its call ends with no answer,
//   is recorded if the sandbox is still suspending, else its reference is released: resumed in place when the
//   sandbox is back in ready on its generation, else discarded; suspend.go)
//   stopping
//     observed stopped, exited → stopped
//     observed running       → stop_rejected + deadline_passed (ready, DeadlineExceeded)
//     observed gone          → resource_lost (error)
//     otherwise              → deadline_passed (error); then driver.Stop again
//   deleting
//     observed gone          → retained_state_invalidated (if one is held) + deleted
//     otherwise              → deadline_passed (error); then driver.Delete again
//
// Every "then driver.X" is a sandbox.cleanup_requested appended with the
// deadline: an intent the runner drives until the driver confirms it with
// sandbox.cleaned_up (cleanup.go), never a call made once and forgotten.
//
// The deadline is durable: the runner's saved position never passes the
// event that entered a transient phase it has not seen end, so a restarted
// runner reads that event again and arms its deadline anew, already passed
// if the service was down longer. The gateway refuses a deadline_passed of
// another phase than the sandbox's, or one not due yet, so a deadline of an
// earlier stay in a phase never settles a later one.

// enters says whether an event of type typ, moving a sandbox from phase
// prev to phase next, enters next: a change of phase, or an intent. Each
// intent enters its phase anew (a fallback start after a failed restore
// gets a deadline of its own).
func enters(prev, next events.Phase, typ string) bool {
	return prev != next || events.Intent(typ)
}

// track follows env's sandbox in and out of transient phases, arming and
// disarming its deadline; r.mu is held. created is env decoded when it is
// a sandbox.created, else nil.
func (r *Runner) track(ctx context.Context, env events.Envelope, created *events.Created) {
	id, p := env.SandboxID, env.Phase
	if p == events.PhaseNone {
		return // not stamped: no phase to track
	}
	k := timerKey{id, kindDeadline}
	cur := r.timers[k]
	if !p.Transient() {
		r.disarm(k)
		delete(r.reached, id) // its resume, if any, settled
		return
	}
	var prev events.Phase // none open: any transient phase is entered
	if cur != nil {
		prev = cur.env.Phase
	}
	if !enters(prev, p, env.Type) {
		return
	}
	if created == nil {
		created = r.specs.get(id)
	}
	if created != nil && !r.drives(created.Node) {
		return // another node's runner keeps its deadlines
	}
	r.arm(ctx, k, env, env.Time.Add(r.cfg.Deadline))
}

// extend rearms o's deadline for the time the log was unavailable within
// it that it was not extended for yet, and says whether it did: time in
// which no outcome could be recorded (nor a heartbeat heard) is not held
// against the sandbox.
func (r *Runner) extend(o *timer) bool {
	if r.cfg.Unavailable == nil {
		return false
	}
	out := r.cfg.Unavailable(o.env.Time)
	if out <= o.extended {
		return false
	}
	more := out - o.extended
	o.extended = out
	r.log.Warn().Str("sandbox_id", o.env.SandboxID).Str("phase", string(o.env.Phase)).Uint64("seq", o.env.Seq).
		Dur("by", more).Dur("extended", out).Msg("deadline extended: the log was unavailable within it")
	r.cfg.Metrics.DeadlineExtended()
	r.rearm(o, more)
	return true
}

// settle is the job of a passed deadline: it checks the phase is still the
// one o entered, observes the driver, and records what the table of this
// file says. A nil error means it is done with (recorded, waiting again, or
// not its to settle); an error brings it back after a backoff.
func (r *Runner) settle(ctx context.Context, o *timer) error {
	id := o.env.SandboxID
	r.mu.Lock()
	current := r.armed(o)
	r.mu.Unlock()
	if !current {
		return nil
	}
	if r.extend(o) {
		return nil
	}
	all, err := r.src.Load(ctx, id, 0)
	if err != nil {
		return fmt.Errorf("load %s: %w", id, err)
	}
	st := fold(all)
	if st.entered != o.env.Seq {
		return nil // the log moved on; the runner closes o when it reads that far
	}
	if st.created == nil || !r.drives(st.created.Node) {
		r.drop(o)
		return nil
	}
	log := r.log.With().Str("sandbox_id", id).Str("saga", "deadline").Str("phase", string(st.view.Phase)).
		Int64("generation", st.view.Generation).Uint64("seq", o.env.Seq).Logger()
	s := &step{saga: "deadline", intent: o.env, created: st.created, spec: compute.SpecOf(id, st.created), log: log}
	s.driver, s.drvErr = r.drv.Driver(st.created.Driver)
	if spec, err := r.creds.SpecOf(id, st.created); err == nil {
		s.spec = spec
	}
	var (
		obs     compute.Observation
		evs     []events.Event
		cleanup string
		wait    time.Duration
	)
	// unsure: a resume on another node whose target cannot say whether it
	// consumed the moved state; the state held here then proves nothing.
	var unsure bool
	if st.view.Phase == events.PhaseStarting && st.view.Restore.Held && st.target != "" {
		// A resume on another node: the target is asked first, for a
		// restore that ran (or consumed the state and failed) there while
		// its answer was lost (a slow fetch, say); the sandbox is on the
		// target from its consumption on.
		moved := *s
		moved.spec.Node = st.target
		untouched := r.untouched(o.env)
		switch o := r.observe(ctx, &moved); {
		case o.State == compute.StateRunning && o.Generation == st.view.Generation, o.ConsumedGeneration == st.view.Generation:
			s, obs = &moved, o
			evs, cleanup, wait = r.restoredElsewhere(st, o)
		case o.State == "" && untouched:
			// The target cannot tell, but no resume of this intent ever
			// reached it (each was compute.ErrNotDelivered): it consumed
			// nothing, and the sandbox's own node decides, as for a
			// resume there.
			log.Info().Str("target", st.target).Msg("the target cannot tell, but no resume ever reached it")
		case o.State == "":
			unsure = true
		}
	}
	if evs == nil && wait == 0 {
		obs = r.observe(ctx, s)
		evs, cleanup, wait = r.compensation(st, obs, unsure)
	}
	if wait > 0 && len(evs) == 0 {
		log.Info().Dur("grace", wait).Msg("deadline passed while the service was down; waiting for the supervisor")
		r.rearm(o, wait)
		return nil
	}
	if cleanup != "" {
		// The clean-up is an intent, in the same append: the runner drives
		// it until the driver confirms it (cleanup.go), across restarts.
		evs = append(evs, &events.CleanupRequested{Generation: st.view.Generation, Action: cleanup})
	}
	if o.extended > 0 {
		for _, e := range evs {
			if p, ok := e.(*events.DeadlinePassed); ok {
				p.Extended = o.extended.String()
			}
		}
	}
	log.Warn().Str("observed", string(obs.State)).Str("outcome", evs[0].Type()).Dur("extended", o.extended).Msg("deadline passed")
	err = r.record(ctx, s, evs...)
	switch {
	case errors.Is(err, errRefused):
		// Not due yet on the gateway's clock, or the sandbox moved on: look
		// again in a moment (a sandbox that moved on closes o first).
		log.Info().Err(err).Msg("deadline outcome refused; looking again")
		r.rearm(o, time.Second)
		return nil
	case err != nil:
		return err
	}
	if wait > 0 {
		// The start or the restore the driver observed is recorded, the
		// phase goes on: its supervisor's attach, held at the gateway
		// until this record, is given the grace.
		log.Info().Dur("grace", wait).Msg("the driver's answer never came; its outcome recorded as observed, waiting for the supervisor")
		r.rearm(o, wait)
		return nil
	}
	r.cfg.Metrics.DeadlineFired(string(st.view.Phase))
	return nil
}

// What the driver is told after a deadline ended a phase in error.
const (
	cleanStop   = events.CleanupStop
	cleanDelete = events.CleanupDelete
)

// observe asks the driver what is true of s's sandbox; an unknown state
// when it cannot say.
func (r *Runner) observe(ctx context.Context, s *step) compute.Observation {
	ob, ok := s.driver.(compute.Observer)
	if s.drvErr != nil || !ok {
		return compute.Observation{}
	}
	octx, cancel := context.WithTimeout(ctx, min(r.cfg.Deadline, 10*time.Second))
	defer cancel()
	var o compute.Observation
	err := r.timed(s, "observe", func() (err error) { o, err = ob.Observe(octx, s.spec); return err })
	if err != nil {
		s.log.Warn().Err(err).Msg("observe")
		return compute.Observation{}
	}
	return o
}

// compensation is what a passed deadline records (see the table at the top
// of this file), what the driver is then told to clean up (cleanStop,
// cleanDelete or nothing), or how long to wait before looking again.
// unsure says that a resume's target node could not tell whether it
// consumed the state: obs then proves the state held nowhere.
func (r *Runner) compensation(st state, obs compute.Observation, unsure bool) (evs []events.Event, cleanup string, wait time.Duration) {
	gen, v := st.view.Generation, st.view
	passed := &events.DeadlinePassed{Phase: v.Phase, Deadline: r.cfg.Deadline.String()}
	msg := fmt.Sprintf("no outcome within the %s deadline; observed %q", r.cfg.Deadline, obs.State)
	is := func(s compute.State) bool { return obs.State == s && obs.Generation == gen }
	switch v.Phase {
	case events.PhaseStarting, events.PhaseProvisioning:
		resuming := v.Phase == events.PhaseStarting && v.Restore.Held
		// The attach grace after a restart still to give: a deadline
		// rearmed to wait for it comes back when none is left.
		grace := time.Until(r.began.Add(r.cfg.Grace))
		// What the log does not hold yet when the resume consumed the
		// state: its consumption, the point of no return passed unseen.
		var consumed []events.Event
		if resuming {
			consumed = []events.Event{&events.RetainedStateConsumed{Generation: gen, RestoreRef: st.held}}
		}
		switch {
		case resuming && obs.State == compute.StateGone:
			return []events.Event{&events.ResourceLost{Generation: gen, Message: msg}}, "", 0
		case is(compute.StateExited):
			// The workload of this generation ran and ended before its
			// supervisor attached (or before its attach was taken): the
			// exit, its code kept, not a deadline with none.
			return append(consumed, &events.Exited{Generation: gen, Code: obs.ExitCode}), "", 0
		case is(compute.StateRunning) && grace > 0:
			return nil, "", grace
		case is(compute.StateRunning) && st.outcome != gen:
			// The driver's answer never came, but the workload runs: the
			// start, or the restore, happened. Recorded as the saga would
			// have (one writer per fact: the runner), and its supervisor,
			// whose attach the gateway holds until this record, is given
			// the grace before the deadline is recorded.
			if st.resuming {
				return append(consumed, &events.Resumed{Generation: gen, Outcome: events.OutcomeRestored}), "", r.cfg.Grace
			}
			return []events.Event{&events.Started{Generation: gen}}, "", r.cfg.Grace
		case resuming && !is(compute.StateRunning) && !consumedFor(obs, gen, st.held):
			if !unsure && stillHeld(obs, st.held) {
				// Back to suspended only on the driver's word that the
				// state is still held behind the reference (CONTRACT §1,
				// invariant 1).
				return []events.Event{&events.ResumeFailed{Generation: gen, Message: msg}, passed}, "", 0
			}
			// Nothing says the state is held, nothing says it was
			// consumed: error, the reference left held in the log for the
			// delete to invalidate.
			return []events.Event{passed}, cleanStop, 0
		}
		// Running without an attach, consumed and failed, or never
		// attached: error, the driver cleans up; a consumption first.
		return append(consumed, passed), cleanStop, 0
	case events.PhaseSuspending:
		switch {
		case is(compute.StateFrozen) && obs.RestoreRef != "":
			return []events.Event{&events.Suspended{Generation: gen, RestoreRef: obs.RestoreRef, Bytes: obs.RetainedBytes}}, "", 0
		case is(compute.StateRunning):
			return []events.Event{&events.SuspendRejected{Generation: gen, Reason: events.ReasonDeadlineExceeded, Message: msg}, passed}, "", 0
		case is(compute.StateExited):
			return []events.Event{&events.Exited{Generation: gen, Code: obs.ExitCode}}, "", 0
		case obs.State == compute.StateGone:
			return []events.Event{&events.ResourceLost{Generation: gen, Message: msg}}, "", 0
		}
	case events.PhaseStopping:
		switch {
		case is(compute.StateStopped), is(compute.StateExited):
			return []events.Event{&events.Stopped{Generation: gen}}, "", 0
		case is(compute.StateRunning):
			return []events.Event{&events.StopRejected{Generation: gen, Message: msg}, passed}, "", 0
		case obs.State == compute.StateGone:
			return []events.Event{&events.ResourceLost{Generation: gen, Message: msg}}, "", 0
		}
		return []events.Event{passed}, cleanStop, 0
	case events.PhaseDeleting:
		if obs.State == compute.StateGone {
			if st.held != "" {
				return []events.Event{&events.RetainedStateInvalidated{RestoreRef: st.held}, &events.Deleted{}}, "", 0
			}
			return []events.Event{&events.Deleted{}}, "", 0
		}
		return []events.Event{passed}, cleanDelete, 0
	}
	return []events.Event{passed}, "", 0
}

// consumedFor says whether obs shows the retained state behind ref consumed
// by the resume of generation gen: the driver's newest consumption is of
// ref, or for gen (a state that moved is consumed under another reference).
func consumedFor(obs compute.Observation, gen int64, ref string) bool {
	return obs.ConsumedGeneration == gen || (ref != "" && obs.Consumed == ref)
}

// stillHeld says whether obs is the driver's word that the retained state
// behind ref is held: the workload frozen behind it.
func stillHeld(obs compute.Observation, ref string) bool {
	return obs.State == compute.StateFrozen && ref != "" && obs.RestoreRef == ref
}

// restoredElsewhere is what a passed deadline of a resume on another node
// records when the target, observed as obs, consumed the moved state for
// the resumed generation: the restore ran there (or failed after the
// consumption), as for a resume on the sandbox's node (compensation): the
// consumption, on the target, then the exit the target observed, with its
// code, or the deadline; the target then stops what never attached.
// As there, a running workload's deadline waits out what is left of the
// attach grace after a restart.
func (r *Runner) restoredElsewhere(st state, obs compute.Observation) ([]events.Event, string, time.Duration) {
	gen := st.view.Generation
	consumed := &events.RetainedStateConsumed{Generation: gen, RestoreRef: st.held, Node: st.target}
	if obs.Consumed != "" && obs.Consumed != st.held && obs.ConsumedGeneration == gen {
		consumed.Via = obs.Consumed
	}
	switch {
	case obs.State == compute.StateExited && obs.Generation == gen:
		return []events.Event{consumed, &events.Exited{Generation: gen, Code: obs.ExitCode}}, "", 0
	case obs.State == compute.StateRunning && obs.Generation == gen:
		if grace := time.Until(r.began.Add(r.cfg.Grace)); grace > 0 {
			return nil, "", grace
		}
		// The restore ran there and its answer never came: recorded as
		// the saga would have, then the grace for the held attach (see
		// compensation).
		return []events.Event{consumed, &events.Resumed{Generation: gen, Outcome: events.OutcomeRestored}}, "", r.cfg.Grace
	}
	passed := &events.DeadlinePassed{Phase: st.view.Phase, Deadline: r.cfg.Deadline.String()}
	return []events.Event{consumed, passed}, cleanStop, 0
}

// state is what a passed deadline needs to know of a sandbox, folded from
// its whole log.
type state struct {
	view    events.View
	created *events.Created
	held    string // the restore reference held
	entered uint64 // the sequence of the event that entered the phase
	// target is the node the newest resume request moves the sandbox to,
	// when it names another than the sandbox's.
	target string
	// resuming says that the newest intent that minted a generation is a
	// resume (not a create or a start); outcome is the newest generation
	// whose start or restore is recorded (sandbox.started, sandbox.resumed).
	resuming bool
	outcome  int64
}

// fold reads a sandbox's log into a state; a phase is entered as track
// enters it (enters).
func fold(log []events.Envelope) state {
	var st state
	for _, env := range log {
		prev := st.view.Phase
		if !st.view.Fold(env) {
			continue
		}
		if enters(prev, st.view.Phase, env.Type) {
			st.entered = env.Seq
		}
		if env.Type == events.TypeCreated {
			if c, err := env.Decode(); err == nil {
				st.created = c.(*events.Created)
			}
		}
		if node := movedTo(env); node != "" && st.created != nil {
			st.created = onNode(st.created, node)
		}
		switch env.Type {
		case events.TypeCreated, events.TypeStartRequested:
			st.resuming = false
		case events.TypeResumeRequested:
			st.resuming = true
		case events.TypeStarted, events.TypeResumed:
			if e, err := env.Decode(); err == nil {
				st.outcome = e.(interface{ SpeaksFor() int64 }).SpeaksFor()
			}
		}
		if env.Type == events.TypeResumeRequested {
			st.target = ""
			if e, err := env.Decode(); err == nil && st.created != nil && e.(*events.ResumeRequested).Node != st.created.Node {
				st.target = e.(*events.ResumeRequested).Node
			}
		}
	}
	st.held = heldRef(log)
	return st
}
