package sagas

import (
	"context"
	"errors"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// restoredAt is the outcome of a restore of generation gen the driver
// answered res to: sandbox.resumed{restored} with the driver's times of the
// restore's stages (README "Resume latency").
func restoredAt(gen int64, res compute.ResumeResult) *events.Resumed {
	return &events.Resumed{
		Generation:       gen,
		Outcome:          events.OutcomeRestored,
		RestoreStartedAt: res.RestoreStartedAt,
		RunningAt:        res.RunningAt,
		LoadedAt:         res.LoadedAt,
	}
}

// recordResumed records e, s's restore, as recordOrDrop does, and once it
// is in the log (not dropped) observes its resume latency.
func (r *Runner) recordResumed(ctx context.Context, s *step, e *events.Resumed) error {
	err := r.record(ctx, s, e)
	switch {
	case errors.Is(err, errRefused):
		s.log.Info().Err(err).Str("step", "record").Msg("sandbox moved on; outcome dropped")
		return nil
	case err != nil:
		return err
	}
	r.resumeLatency(s, e)
	return nil
}

// resumeLatency observes the stages of s's resume that e, its recorded
// outcome, carries, each from the command accepted (the time of the
// intent, sandbox.resume_requested). The ready stage is the gateway's,
// which records the attach (services/gateway).
func (r *Runner) resumeLatency(s *step, e *events.Resumed) {
	accepted := s.intent.Time
	if accepted.IsZero() {
		return
	}
	if !e.RestoreStartedAt.IsZero() {
		r.cfg.Metrics.ResumeStage(s.created.Driver, events.StageRestoreStarted, e.RestoreStartedAt.Sub(accepted))
	}
	if !e.RunningAt.IsZero() {
		r.cfg.Metrics.ResumeStage(s.created.Driver, events.StageRunning, e.RunningAt.Sub(accepted))
	}
	if !e.LoadedAt.IsZero() {
		r.cfg.Metrics.ResumeStage(s.created.Driver, events.StageLoaded, e.LoadedAt.Sub(accepted))
	}
}
