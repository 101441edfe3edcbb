package sagas

import (
	"context"
	"errors"
	"fmt"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Clean-up saga (after a deadline that ended its phase in error, deadline.go; issue 24, hole 7):
//   sandbox.cleanup_requested{generation, action}, appended with the deadline
//     → driver.Stop(generation) (action stop) or driver.Delete (action delete)
//     ok, resource missing → record sandbox.cleaned_up{generation, action}
//     anything else        → the step comes again after the runner's backoff, for as long as it takes; the
//                            intent holds the runner's position, so a restarted runner drives it again
//   a later intent (a delete) supersedes it.

func (r *Runner) cleanup(ctx context.Context, s *step, in *events.CleanupRequested) error {
	s.log = s.log.With().Int64("generation", in.Generation).Str("step", "clean up").Logger()
	var undo func(context.Context) error
	switch in.Action {
	case events.CleanupStop:
		t := compute.Target{Spec: s.spec, Generation: in.Generation}
		undo = func(ctx context.Context) error { return s.driver.Stop(ctx, t) }
	case events.CleanupDelete:
		undo = func(ctx context.Context) error { return s.driver.Delete(ctx, s.spec) }
	default:
		s.log.Error().Str("action", in.Action).Msg("unknown clean-up action; intent dropped")
		return nil
	}
	err := r.compensate(ctx, s, "clean up: "+in.Action, in.Action, undo)
	switch {
	case err == nil, errors.Is(err, compute.ErrResourceMissing):
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", errStopping, ctx.Err())
	default:
		return err
	}
	return r.recordOrDrop(ctx, s, &events.CleanedUp{Generation: in.Generation, Action: in.Action})
}
