package sagas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Resume saga:
//   sandbox.resume_requested{generation, restore_ref, restart_if_restore_fails}
//     → driver.Resume(spec, generation, credential minted for it, ref), called again while it gets no answer
//     ok                       → record sandbox.retained_state_consumed{generation, ref}, then sandbox.resumed{generation, restored}
//                                (this saga is their one writer: the resumed generation's supervisor records only its
//                                attach, which the gateway holds until sandbox.resumed is in the log; at a passed
//                                deadline the runner records them as the driver observed, deadline.go)
//     (first, a driver that is a compute.Checker is asked whether the target can restore ref: a refusal records
//     sandbox.resume_failed{generation, node, reason CannotRestore, message}, nothing consumed, never asked again: check.go)
//     failed, not consumed     → record sandbox.resume_failed{generation}   (suspended again, retryable; the gateway turns it
//                                into the failure after the consumption when the log holds the consumption)
//     the reference unknown    → as failed after consuming: the driver holds nothing behind it (consumed by an earlier
//     (compute.ErrUnknownRef)    resume whose answer was lost, discarded, never made), never suspended on it again
//     failed after consuming   → record sandbox.retained_state_consumed + one of, in the same record:
//                                  restart_if_restore_fails: sandbox.start_requested{generation+1, fallback} (the start saga cold-starts it)
//                                  strict:                   sandbox.stopped{generation, RetainedStateLost}
//     resource missing         → record sandbox.resource_lost{generation}
//     deadline                 → nothing here: the phase's deadline settles it (deadline.go: suspended only if the driver
//                                says the state is still held, else error); an answer that comes after the deadline is
//                                still the answer, and is recorded as above
//   env sealed under a key this service no longer holds (it cannot open): no cold start can follow a failed restore,
//     so a fresh resume with restart_if_restore_fails is refused before the driver is called → sandbox.resume_failed
//     saying why (suspended, the state kept); one whose state was consumed already ends as a strict one
//   with node (resume on another node): first driver.Export(spec on its node, ref) → the reference the state moves under,
//     then driver.Resume on the target node with it (both called again while they get no answer; the runner notes
//     whether any Resume may have reached the target, reach, for the deadline of a target that cannot tell what it
//     did); on a refusal the exported copy stays with the state held on the old node; the consumption records the node (the sandbox's from then on) and the moved reference; once resumed, driver.Discard(ref) on the
//     old node, so that it holds nothing of the sandbox (asked again in the background while it does not answer;
//     the delete saga tells it too). A re-driven resume whose consumption is recorded already
//     resumes the moved reference on the node the log now names.

func (r *Runner) resume(ctx context.Context, s *step, in *events.ResumeRequested) error {
	gen := in.Generation
	s.log = s.log.With().Int64("generation", gen).Logger()
	if in.RestartIfRestoreFails && s.envErr != nil && consumedBy(s) == nil {
		// The fallback would start the workload with the redacted values:
		// refused while the retained state is untouched.
		s.log.Warn().Err(s.envErr).Str("step", "resume").Msg("no cold start could follow a failed restore; resume refused")
		return r.recordOrDrop(ctx, s, &events.ResumeFailed{Generation: gen, Message: fmt.Sprintf(
			"env sealed under a key this service no longer holds (%v): no cold start could follow a failed restore; the retained state is kept, resume without restart_if_restore_fails", s.envErr)})
	}
	bus, err := r.busCreds(s, gen)
	if err != nil {
		return fmt.Errorf("resume %s: supervisor's bus credentials: %w", s.spec.SandboxID, err)
	}
	req := compute.Resume{
		Spec:       s.spec,
		Generation: gen,
		Credential: r.creds.Mint(s.spec.SandboxID, gen),
		RestoreRef: in.RestoreRef,
		BusCreds:   bus,
	}
	consumed := &events.RetainedStateConsumed{Generation: gen, RestoreRef: in.RestoreRef}
	from := s.spec // where the state is held, when it moves
	moving := in.Node != "" && in.Node != s.spec.Node
	if c := consumedBy(s); c != nil && c.Node != "" {
		// Consumed on the target already: the log names it the sandbox's
		// node, and the moved reference is recorded.
		moving, req.RestoreRef = false, c.Via
		consumed.Node, consumed.Via = c.Node, c.Via
	}
	if moving {
		req.Spec.Node, consumed.Node = in.Node, in.Node
		s.log = s.log.With().Str("from", from.Node).Str("to", in.Node).Logger()
	}
	var res compute.ResumeResult
	fresh := consumedBy(s) == nil // nothing consumed yet: the target is asked first (check.go)
	sent := false
	reached := func(error) {}
	if moving {
		reached = r.aim(s)
	}
	err = r.within(ctx, s, "resume", unanswered, func(ctx context.Context) (err error) {
		if s.suspender == nil {
			return fmt.Errorf("driver %s: %w", s.created.Driver, compute.ErrUnimplemented)
		}
		if moving && consumed.Via == "" {
			ex, ok := s.driver.(compute.Exporter)
			if !ok {
				return fmt.Errorf("driver %s cannot move retained state: %w", s.created.Driver, compute.ErrUnimplemented)
			}
			if consumed.Via, err = ex.Export(ctx, from, in.RestoreRef); err != nil {
				consumed.Via = ""
				return fmt.Errorf("export from %s: %w", from.Node, err)
			}
			req.RestoreRef = consumed.Via
		}
		if fresh && !sent {
			if err := r.checkTarget(ctx, s, req.Spec, req.RestoreRef); err != nil {
				return err
			}
		}
		sent = true // a resume may reach the target: it is not asked again
		res, err = s.suspender.Resume(ctx, req)
		reached(err)
		return err
	})
	switch {
	case err == nil:
		// The consumption first, on its own: the point of no return, recorded
		// before the outcome (two appends cost far less than one atomic batch;
		// a crash between them re-drives the resume, see progress).
		if err := r.recordOrDrop(ctx, s, consumed); err != nil {
			return err
		}
		if err := r.recordResumed(ctx, s, restoredAt(gen, res)); err != nil {
			return err
		}
		if moving {
			r.leave(ctx, s, from, in.RestoreRef)
		}
		return nil
	case errors.Is(err, errStopping):
		return err
	case errors.As(err, new(*refusal)):
		// The target cannot restore it: nothing consumed, the state held;
		// suspended again, the history saying why (check.go).
		s.log.Info().Err(err).Str("step", "check").Msg("the target refused the restore; retained state kept")
		if err := r.recordOrDrop(ctx, s, &events.ResumeFailed{Generation: gen, Message: err.Error(), Node: req.Spec.Node, Reason: events.ReasonCannotRestore}); err != nil {
			return err
		}
		r.forgetRefusal(s)
		return nil
	case errors.Is(err, errDeadline):
		s.log.Warn().Err(err).Str("step", "resume").Msg("deadline passed; the phase's deadline settles it")
		return nil
	case errors.Is(err, compute.ErrResourceMissing):
		return r.recordOrDrop(ctx, s, &events.ResourceLost{Generation: gen, Message: err.Error()})
	case errors.Is(err, compute.ErrUnknownRef):
		// The driver holds nothing behind the reference (an earlier resume
		// consumed it while its answer was lost, say): the sandbox is never
		// suspended on it again, and takes the path after a consumption.
		s.log.Warn().Err(err).Str("step", "resume").Msg("the driver holds no retained state behind the reference")
	case !res.Consumed:
		s.log.Info().Err(err).Str("step", "resume").Msg("restore failed; retained state kept")
		return r.recordOrDrop(ctx, s, &events.ResumeFailed{Generation: gen, Message: err.Error()})
	}
	switch {
	case in.RestartIfRestoreFails && s.envErr == nil:
		s.log.Warn().Err(err).Str("step", "resume").Msg("restore failed after consuming; cold start")
		return r.recordOrDrop(ctx, s, consumed, &events.StartRequested{Generation: gen + 1, Fallback: true})
	case in.RestartIfRestoreFails:
		s.log.Warn().Err(err).AnErr("env", s.envErr).Str("step", "resume").Msg("restore failed after consuming; no cold start: the env is sealed under a key this service no longer holds")
	}
	s.log.Warn().Err(err).Str("step", "resume").Msg("restore failed after consuming; retained state lost")
	return r.recordOrDrop(ctx, s, consumed, &events.Stopped{Generation: gen, Reason: events.ReasonRetainedStateLost})
}

// reach is what the runner knows of the resume attempts of one intent, a
// resume on another node: whether any may have reached the target. Only a
// call that provably reached no driver (compute.ErrNotDelivered: nobody
// serves the node) did not; an answer, a timeout, any other failure may
// have. A passed deadline whose target cannot tell what it did reads it
// (deadline.go): a target no resume ever reached consumed nothing. It is
// memory only: a runner restarted knows nothing of the attempts of the
// one before it, and such a deadline then ends in error as before.
type reach struct {
	intent    string // the resume request's event id
	delivered bool   // an attempt may have reached the target
}

// aim starts, or goes on with, the reach of s's intent, a resume on
// another node (none delivered yet), and returns what notes the outcome of
// each Resume sent to the target. It keeps none for an intent that was in
// the log before this runner first read to its head: a runner before it
// may have sent it.
func (r *Runner) aim(s *step) func(error) {
	id := s.intent.SandboxID
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live == 0 || s.intent.Seq <= r.live {
		delete(r.reached, id)
		return func(error) {}
	}
	a := r.reached[id]
	if a == nil || a.intent != s.intent.ID {
		a = &reach{intent: s.intent.ID}
		r.reached[id] = a
	}
	return func(err error) {
		if errors.Is(err, compute.ErrNotDelivered) {
			return
		}
		r.mu.Lock()
		a.delivered = true
		r.mu.Unlock()
	}
}

// untouched says whether the runner knows that no resume of intent, a
// resume on another node, ever reached the target.
func (r *Runner) untouched(intent events.Envelope) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.reached[intent.SandboxID]
	return a != nil && a.intent == intent.ID && !a.delivered
}

// consumedBy is the consumption the resume intent of s caused, if the log
// holds one after it.
func consumedBy(s *step) *events.RetainedStateConsumed {
	for _, e := range s.later {
		if e.Type != events.TypeRetainedStateConsumed || e.CausationID != s.intent.ID {
			continue
		}
		if d, err := e.Decode(); err == nil {
			return d.(*events.RetainedStateConsumed)
		}
	}
	return nil
}

// leave discards the retained state a resume moved away from node from.Node:
// the old node holds nothing of the sandbox. It is tidying, not an outcome.
// A node that does not answer (down) is asked again in the background,
// with a backoff from leaveRetryMin up to retryMax, until it answers or the
// runner stops; a copy a stopped runner never got discarded goes with the
// sandbox's delete, which tells every node the sandbox was ever on
// (formerNodes). Each failure is logged.
func (r *Runner) leave(ctx context.Context, s *step, from compute.Spec, ref string) {
	sus, ok := s.driver.(compute.Suspender)
	if !ok {
		return
	}
	discard := func() error {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return r.timed(s, "discard", func() error { return sus.Discard(dctx, from, ref) })
	}
	err := discard()
	if err == nil {
		return
	}
	log := s.log.With().Str("step", "leave").Logger()
	if !errors.Is(err, compute.ErrUnavailable) {
		log.Warn().Err(err).Msg("the old node's copy of the moved state is not discarded")
		return
	}
	log.Warn().Err(err).Msg("the old node does not answer; its copy of the moved state is discarded once it does")
	r.workers.Go(func() {
		for wait, tries := leaveRetryMin, 1; sleep(ctx, wait); wait, tries = min(2*wait, retryMax), tries+1 {
			switch err := discard(); {
			case err == nil:
				log.Info().Int("tries", tries+1).Msg("the old node's copy of the moved state is discarded")
				return
			case !errors.Is(err, compute.ErrUnavailable):
				log.Warn().Err(err).Msg("the old node's copy of the moved state is not discarded")
				return
			}
		}
	})
}

// leaveRetryMin is the first wait before an old node that did not answer
// leave is asked again.
const leaveRetryMin = 250 * time.Millisecond
