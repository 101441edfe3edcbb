package sagas

import (
	"context"
	"errors"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Stop saga:
//   sandbox.stop_requested{generation} → driver.Stop(generation), called again until the driver answers
//     ok               → record sandbox.stopped{generation}
//     resource missing → record sandbox.resource_lost{generation}
//     rejected         → record sandbox.stop_rejected{generation, message}   (the workload runs on)
//     deadline         → nothing here: the phase's deadline settles it (deadline.go)

func (r *Runner) stop(ctx context.Context, s *step, in *events.StopRequested) error {
	s.log = s.log.With().Int64("generation", in.Generation).Logger()
	t := compute.Target{Spec: s.spec, Generation: in.Generation}
	err := r.within(ctx, s, "stop", unrefused, func(ctx context.Context) error { return s.driver.Stop(ctx, t) })
	switch {
	case err == nil:
		return r.recordOrDrop(ctx, s, &events.Stopped{Generation: in.Generation})
	case errors.Is(err, errStopping):
		return err
	case errors.Is(err, errDeadline):
		s.log.Warn().Err(err).Str("step", "stop").Msg("deadline passed; the phase's deadline settles it")
		return nil
	case errors.Is(err, compute.ErrResourceMissing):
		return r.recordOrDrop(ctx, s, &events.ResourceLost{Generation: in.Generation, Message: err.Error()})
	}
	s.log.Warn().Err(err).Str("step", "stop").Msg("stop rejected")
	return r.recordOrDrop(ctx, s, &events.StopRejected{Generation: in.Generation, Message: err.Error()})
}
