package sagas

import (
	"context"
	"errors"
	"fmt"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Create and start sagas:
//   sandbox.created{generation} or sandbox.start_requested{generation}
//     → driver.Discard(ref) for each retained_state_discarded appended with the intent (explicit start of a suspended sandbox)
//     → driver.Start(spec, generation, credential minted for it), called again while it gets no answer
//     ok       → record sandbox.started{generation}            | the sandbox is ready when its supervisor attaches
//                (this saga is its one writer; the supervisor's attach is held at the gateway until it is in the log,
//                so started always comes before attached; at a passed deadline the runner records it as observed)
//     error    → record sandbox.start_failed{generation, message}
//     deadline → nothing here: the phase's deadline settles it (deadline.go: error, the driver told to stop it)

// start cold-starts generation gen.
func (r *Runner) start(ctx context.Context, s *step, gen int64) error {
	s.log = s.log.With().Int64("generation", gen).Logger()
	if s.drvErr != nil {
		return r.recordOrDrop(ctx, s, &events.StartFailed{Generation: gen, Message: s.drvErr.Error()})
	}
	if s.suspender != nil { // a driver that cannot suspend retains nothing
		refs := discardedWith(s.later)
		if len(refs) == 0 && s.intent.Type == events.TypeStartRequested {
			// The gateway appends the discards with the intent, in one
			// atomic batch, but a reading of the log may hand the intent
			// over on its own, as the head: the log says for sure.
			later, err := r.src.Load(ctx, s.spec.SandboxID, s.intent.Seq)
			if err != nil {
				return fmt.Errorf("load %s after %d: %w", s.spec.SandboxID, s.intent.Seq, err)
			}
			refs = discardedWith(later)
		}
		for _, ref := range refs {
			err := r.within(ctx, s, "discard", unanswered, func(ctx context.Context) error { return s.suspender.Discard(ctx, s.spec, ref) })
			if err != nil && !errors.Is(err, errDeadline) {
				s.log.Warn().Err(err).Str("step", "discard").Msg("discard retained state")
				return err
			}
		}
	}
	bus, err := r.busCreds(s, gen)
	if err != nil {
		return fmt.Errorf("start %s: supervisor's bus credentials: %w", s.spec.SandboxID, err)
	}
	req := compute.Start{Spec: s.spec, Generation: gen, Credential: r.creds.Mint(s.spec.SandboxID, gen), BusCreds: bus}
	err = r.within(ctx, s, "start", unanswered, func(ctx context.Context) error { return s.driver.Start(ctx, req) })
	switch {
	case err == nil:
		// The hash stays empty: supervisors are verified by HMAC.
		return r.recordOrDrop(ctx, s, &events.Started{Generation: gen})
	case errors.Is(err, errStopping):
		return err
	case errors.Is(err, errDeadline):
		s.log.Warn().Err(err).Str("step", "start").Msg("deadline passed; the phase's deadline settles it")
		return nil
	}
	s.log.Warn().Err(err).Str("step", "start").Msg("start failed")
	return r.recordOrDrop(ctx, s, &events.StartFailed{Generation: gen, Message: err.Error()})
}

// discardedWith returns the references of the retained_state_discarded
// events appended together with the intent: the run of them right after it.
func discardedWith(later []events.Envelope) []string {
	var refs []string
	for _, e := range later {
		if e.Type != events.TypeRetainedStateDiscarded {
			break
		}
		d, err := e.Decode()
		if err != nil {
			break
		}
		refs = append(refs, d.(*events.RetainedStateDiscarded).RestoreRef)
	}
	return refs
}

// busCreds is the NATS user of generation gen's supervisor, none for a
// driver that reports for its sandboxes itself.
func (r *Runner) busCreds(s *step, gen int64) (string, error) {
	if d, ok := s.driver.(compute.SelfReporting); ok && d.ReportsItself() {
		return "", nil
	}
	return r.creds.MintBus(s.spec.SandboxID, gen)
}
