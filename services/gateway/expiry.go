package gateway

import (
	"time"

	"github.com/torpor/torpor/events"
)

// expired decides what a reported expiry appends (issue 27, items 4 and
// 5), judged against the state at the head of the sandbox's log (a
// conflict decides again): the expiry, then the start of its action.
//   - ttl: the sandbox's expires_at, due at now and not recorded yet
//     (with ttl_pauses_while_suspended, the view's: created's moved later
//     by the stays in suspended, none due while one is under way);
//     delete → delete_requested (the delete saga runs), in any phase but
//     deleting and deleted; stop → stop_requested in ready, the retained
//     state invalidated (Expired: the sandbox is stopped, the sagas release
//     it) in suspended, nothing more (action none) in stopped or error; a
//     transient phase is refused: the sagas try again once it settles.
//   - retention: the retained state named, still held, the sandbox
//     suspended on it, and its retain_for since the suspension passed at
//     now → the state invalidated (Expired): stopped.
//
// Anything else (not due, another or no state held, a TTL recorded
// already, forged) is FAILED_PRECONDITION, as a premature deadline is.
func expired(s *Sandbox, e *events.Expired, now time.Time) ([]events.Event, error) {
	switch e.Policy {
	case events.ExpiryTTL:
		at := s.Spec.ExpiresAt
		if s.Spec.TTLPausesWhileSuspended {
			at = s.View.ExpiresAt
		}
		switch {
		case at.IsZero() || !e.ExpiresAt.Equal(at):
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: an expiry at %s, but its ttl is %s", s.ID, e.ExpiresAt.Format(time.RFC3339Nano), orNone(at))
		case s.Spec.TTLPausesWhileSuspended && s.View.ExpiryPaused:
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is suspended: its ttl is paused until it leaves suspended", s.ID)
		case now.Before(at):
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: its ttl is not due: it expires at %s", s.ID, at.Format(time.RFC3339Nano))
		case s.TTLSpent:
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: its ttl expiry is recorded already", s.ID)
		case s.Phase == events.PhaseDeleting || s.Phase == events.PhaseDeleted:
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s: nothing to expire", s.ID, s.Phase)
		}
		ttl := &events.Expired{Policy: events.ExpiryTTL, ExpiresAt: at, Action: s.Spec.OnExpiry}
		if s.Spec.OnExpiry != events.OnExpiryStop {
			ttl.Action = events.OnExpiryDelete
			return []events.Event{ttl, &events.DeleteRequested{}}, nil
		}
		switch s.Phase {
		case events.PhaseReady:
			return []events.Event{ttl, &events.StopRequested{Generation: s.Generation}}, nil
		case events.PhaseSuspended:
			if s.RestoreRef != "" {
				return []events.Event{ttl, &events.RetainedStateInvalidated{RestoreRef: s.RestoreRef, Reason: events.ReasonExpired}}, nil
			}
		case events.PhaseStopped, events.PhaseError:
			ttl.Action = events.ExpiryNone
			return []events.Event{ttl}, nil
		}
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s: its ttl stops it once it settles", s.ID, s.Phase)
	case events.ExpiryRetention:
		end := events.RetentionEnd(s.HeldSince, s.Spec.RetainFor)
		switch {
		case s.Phase != events.PhaseSuspended || s.RestoreRef == "" || e.RestoreRef != s.RestoreRef:
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s: the retained state %q is not what it holds", s.ID, s.Phase, e.RestoreRef)
		case end.IsZero() || !e.ExpiresAt.Equal(end):
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: a retention expiry at %s, but its state is held until %s", s.ID, e.ExpiresAt.Format(time.RFC3339Nano), orNone(end))
		case now.Before(end):
			return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: its retained state is not due: it expires at %s", s.ID, end.Format(time.RFC3339Nano))
		}
		return []events.Event{
			&events.Expired{Policy: events.ExpiryRetention, ExpiresAt: end, Action: events.OnExpiryStop, RestoreRef: s.RestoreRef},
			&events.RetainedStateInvalidated{RestoreRef: s.RestoreRef, Reason: events.ReasonExpired},
		}, nil
	}
	return nil, events.Errorf(events.CodeInvalidArgument, "sandbox %s: an expiry of policy %q", s.ID, e.Policy)
}

func orNone(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return t.Format(time.RFC3339Nano)
}
