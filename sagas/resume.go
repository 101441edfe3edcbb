package sagas

import (
	"context"
	"errors"
	"fmt"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Resume saga:
//   sandbox.resume_requested{generation, restore_ref, restart_if_restore_fails}
//     → driver.Resume(spec, generation, credential minted for it, ref), called again while it gets no answer
//     ok                       → record sandbox.retained_state_consumed{generation, ref}, then sandbox.resumed{generation, restored}
//     failed, not consumed     → record sandbox.resume_failed{generation}   (suspended again, retryable; the gateway turns it
//                                into the failure after the consumption when the log holds the consumption)
//     failed after consuming   → record sandbox.retained_state_consumed + one of, in the same record:
//                                  restart_if_restore_fails: sandbox.start_requested{generation+1, fallback} (the start saga cold-starts it)
//                                  strict:                   sandbox.stopped{generation, RetainedStateLost}
//     resource missing         → record sandbox.resource_lost{generation}
//     deadline                 → nothing here: the phase's deadline settles it (deadline.go: suspended if the state was
//                                not consumed, else error)

func (r *Runner) resume(ctx context.Context, s *step, in *events.ResumeRequested) error {
	gen := in.Generation
	s.log = s.log.With().Int64("generation", gen).Logger()
	req := compute.Resume{
		Spec:       s.spec,
		Generation: gen,
		Credential: r.creds.Mint(s.spec.SandboxID, gen),
		RestoreRef: in.RestoreRef,
	}
	var res compute.ResumeResult
	err := r.within(ctx, s, unanswered, func(ctx context.Context) (err error) {
		if s.suspender == nil {
			return fmt.Errorf("driver %s: %w", s.created.Driver, compute.ErrUnimplemented)
		}
		res, err = s.suspender.Resume(ctx, req)
		return err
	})
	consumed := &events.RetainedStateConsumed{Generation: gen, RestoreRef: in.RestoreRef}
	switch {
	case err == nil:
		// The consumption first, on its own: the point of no return, recorded
		// before the outcome (two appends cost far less than one atomic batch;
		// a crash between them re-drives the resume, see progress).
		if err := r.recordOrDrop(ctx, s, consumed); err != nil {
			return err
		}
		return r.recordOrDrop(ctx, s, &events.Resumed{Generation: gen, Outcome: events.OutcomeRestored})
	case errors.Is(err, errStopping):
		return err
	case errors.Is(err, errDeadline):
		s.log.Warn().Err(err).Str("step", "resume").Msg("deadline passed; the phase's deadline settles it")
		return nil
	case errors.Is(err, compute.ErrResourceMissing):
		return r.recordOrDrop(ctx, s, &events.ResourceLost{Generation: gen, Message: err.Error()})
	case !res.Consumed:
		s.log.Info().Err(err).Str("step", "resume").Msg("restore failed; retained state kept")
		return r.recordOrDrop(ctx, s, &events.ResumeFailed{Generation: gen, Message: err.Error()})
	case in.RestartIfRestoreFails:
		s.log.Warn().Err(err).Str("step", "resume").Msg("restore failed after consuming; cold start")
		return r.recordOrDrop(ctx, s, consumed, &events.StartRequested{Generation: gen + 1, Fallback: true})
	}
	s.log.Warn().Err(err).Str("step", "resume").Msg("restore failed after consuming; retained state lost")
	return r.recordOrDrop(ctx, s, consumed, &events.Stopped{Generation: gen, Reason: events.ReasonRetainedStateLost})
}
