package gateway

import (
	"time"

	"github.com/torpor/torpor/events"
)

// resumeReady is what observes the ready stage of a resume's latency
// (README "Resume latency") once e, a supervisor's report on sb, is
// recorded: the attach of the generation a resume restored, from the
// command accepted (sb entered starting with its sandbox.resume_requested;
// the consumption and the restore leave the phase as it was) to the attach
// recorded. Nil for any other report, a cold start's attach and a
// fallback's among them (its start request ends Resuming).
func (s *Service) resumeReady(sb *Sandbox, e events.Event) func() {
	a, ok := e.(*events.SupervisorAttached)
	if !ok || sb.Phase != events.PhaseStarting || !sb.Resuming || sb.Restored != a.Generation || sb.Entered.IsZero() {
		return nil
	}
	driver, accepted := sb.Spec.Driver, sb.Entered
	return func() { s.cfg.Metrics.ResumeStage(driver, events.StageReady, time.Since(accepted)) }
}
