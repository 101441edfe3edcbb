package sagas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Suspend saga:
//   sandbox.suspend_requested{generation} → driver.Suspend(generation), called again until the driver answers
//     ok               → record sandbox.suspended{restore_ref}   | compensation: driver.Discard(ref) if the record is refused (a racing exit won, or the deadline settled it)
//     rejected         → record sandbox.suspend_rejected{SuspendRejected}
//     unimplemented    → record sandbox.suspend_rejected{SuspendRejected}   (should not happen: the gateway refuses first)
//     resource missing → record sandbox.resource_lost{generation}
//     deadline         → nothing here: the phase's deadline settles it (deadline.go: ready if the workload runs, else error)

func (r *Runner) suspend(ctx context.Context, s *step, in *events.SuspendRequested) error {
	s.log = s.log.With().Int64("generation", in.Generation).Logger()
	t := compute.Target{Spec: s.spec, Generation: in.Generation}
	var ref string
	err := r.within(ctx, s, "suspend", unrefused, func(ctx context.Context) (err error) {
		if s.suspender == nil {
			return fmt.Errorf("driver %s: %w", s.created.Driver, compute.ErrUnimplemented)
		}
		ref, err = s.suspender.Suspend(ctx, t)
		return err
	})
	switch {
	case err == nil:
		err := r.record(ctx, s, &events.Suspended{Generation: in.Generation, RestoreRef: ref, Bytes: r.retainedBytes(ctx, s, ref)})
		if !errors.Is(err, errRefused) {
			return err
		}
		s.log.Info().Err(err).Str("step", "record").Msg("suspended refused; releasing the reference")
		return r.compensate(ctx, s, "discard", "discard", func(ctx context.Context) error { return s.suspender.Discard(ctx, s.spec, ref) })
	case errors.Is(err, errStopping):
		return err
	case errors.Is(err, errDeadline):
		s.log.Warn().Err(err).Str("step", "suspend").Msg("deadline passed; the phase's deadline settles it")
		return nil
	case errors.Is(err, compute.ErrResourceMissing):
		return r.recordOrDrop(ctx, s, &events.ResourceLost{Generation: in.Generation, Message: err.Error()})
	}
	s.log.Info().Err(err).Str("step", "suspend").Msg("suspend rejected")
	return r.recordOrDrop(ctx, s, &events.SuspendRejected{Generation: in.Generation, Reason: events.ReasonSuspendRejected, Message: err.Error()})
}

// retainedBytes is what the driver observes the retained state behind ref
// to keep, or 0 where it cannot say (it does not size what it retains, no
// answer in a moment: the size is for the view, the outcome does not wait
// on it). Drivers that do not size it cost no call.
func (r *Runner) retainedBytes(ctx context.Context, s *step, ref string) int64 {
	ob, ok := s.driver.(compute.Observer)
	if !ok || !s.driver.Capabilities(s.spec.Options).RetainedSize {
		return 0
	}
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var o compute.Observation
	err := r.timed(s, "observe", func() (err error) { o, err = ob.Observe(octx, s.spec); return err })
	if err != nil || o.RestoreRef != ref {
		return 0
	}
	return o.RetainedBytes
}
