package sagas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Expiry (issue 27, items 4 and 5; events/expiry.go):
//   sandbox.created{expires_at}  arms the sandbox's ttl, at expires_at (and its consumption on another node,
//                                that node's runner's)
//   sandbox.suspended            arms its retention, at the suspension's time + retain_for (created's)
//   when one comes due           → load the sandbox's log, decide again on it: nothing to do (expired
//                                  recorded, deleted, the state no longer held) disarms it; not due yet
//                                  rearms it; else record sandbox.expired{policy, expires_at, action}
//                                  (a command of its own, caused by the event that armed it: timer.go)
//                                  through the gateway, which appends it with the start of the action
//                                  (delete_requested; stop_requested; in suspended the retained state
//                                  invalidated, Expired: stopped), at the head of the log, and refuses it
//                                  when not due or no longer true (gateway/expiry.go)
//     refused                    → look again in a second (a transient phase settling, the clocks apart)
//   a ttl that pauses while suspended (created's ttl_pauses_while_suspended)
//                                → its due time is the view's expires_at (created's moved later by every
//                                  stay in suspended); while suspended it is paused: the job parks it
//                                  (armed, its timer stopped) and the first event read with a phase
//                                  other than suspended runs it again, which rearms it at the moved time
//   sandbox.expired, with a retained_state_invalidated{reason: Expired} appended with it
//                                → driver.Discard(ref) (release), again until it answers, across restarts
//
// Durable as every long timer is (timer.go): kept in Config.Timers, or
// holding the saved position, a restarted runner (or the one that takes
// the sagas' lease) arms it again and fires what came due while it was
// down, once: the gateway refuses a second expiry of the same ttl or of a
// state no longer held.

// trackExpiry arms and disarms env's sandbox's expiries; r.mu is held.
// created is env decoded when it is a sandbox.created, else nil.
func (r *Runner) trackExpiry(ctx context.Context, env events.Envelope, created *events.Created) {
	id := env.SandboxID
	ttl, retention := timerKey{id, kindTTL}, timerKey{id, kindRetention}
	switch env.Type {
	case events.TypeCreated:
		if created != nil && !created.ExpiresAt.IsZero() && r.drives(created.Node) {
			r.arm(ctx, ttl, env, created.ExpiresAt)
		}
	case events.TypeSuspended:
		at := time.Now() // retain_for not known here: the job reads it from the log
		if c := r.specs.get(id); c != nil {
			if c.RetainFor == "" || !r.drives(c.Node) {
				return
			}
			at = events.RetentionEnd(env.Time, c.RetainFor)
		}
		r.arm(ctx, retention, env, at)
	case events.TypeExpired:
		if e, err := env.Decode(); err == nil && e.(*events.Expired).Policy == events.ExpiryTTL {
			r.disarm(ttl)
		}
	case events.TypeRetainedStateConsumed, events.TypeRetainedStateDiscarded, events.TypeRetainedStateInvalidated:
		r.disarm(retention)
	}
	if node := movedTo(env); node != "" {
		// A resume on another node moved the sandbox: its ttl is the
		// runner of that node's from now on (armed by this event; the
		// job reads the ttl from the log when the cache lacks it).
		c := r.specs.get(id)
		switch {
		case !r.drives(node):
			r.disarm(ttl)
		case c == nil:
			r.arm(ctx, ttl, env, time.Now())
		case !c.ExpiresAt.IsZero():
			r.arm(ctx, ttl, env, c.ExpiresAt)
		}
	}
	if env.Phase == events.PhaseDeleting || env.Phase == events.PhaseDeleted {
		r.disarm(ttl)
		r.disarm(retention)
	}
	if env.Phase != events.PhaseSuspended && env.Phase != events.PhaseNone {
		// Not (or no longer) suspended: a parked ttl is due again, at
		// the time its stay moved it to (the job reads it from the log).
		r.unpark(ttl, env)
	}
}

// expire is the job of an expiry come due: it decides again on the
// sandbox's log and records the expiry (see the top of this file). A nil
// error means it is done with (recorded, rearmed or disarmed); an error
// brings it back after a backoff.
func (r *Runner) expire(ctx context.Context, x *timer) error {
	id := x.key.id
	all, err := r.src.Load(ctx, id, 0)
	if err != nil {
		return fmt.Errorf("load %s: %w", id, err)
	}
	st := fold(all)
	if st.created == nil || !r.drives(st.created.Node) {
		r.drop(x)
		return nil
	}
	var e *events.Expired
	switch v := st.view; x.key.kind {
	case events.ExpiryTTL:
		if v.ExpiresAt.IsZero() || ttlSpent(all) || v.Phase == events.PhaseDeleting || v.Phase == events.PhaseDeleted {
			r.drop(x)
			return nil
		}
		if v.ExpiryPaused {
			r.park(x, all[len(all)-1].Seq)
			return nil
		}
		e = &events.Expired{Policy: events.ExpiryTTL, ExpiresAt: v.ExpiresAt, Action: v.OnExpiry}
	case events.ExpiryRetention:
		// Held in suspended, or in starting by a resume that may fail
		// back to it; held in error (a resume's deadline), only a delete
		// ends it.
		if !v.Restore.Held || v.Restore.ExpiresAt.IsZero() || st.held == "" ||
			(v.Phase != events.PhaseSuspended && v.Phase != events.PhaseStarting) {
			r.drop(x)
			return nil
		}
		e = &events.Expired{Policy: events.ExpiryRetention, ExpiresAt: v.Restore.ExpiresAt, Action: events.OnExpiryStop, RestoreRef: st.held}
	default:
		r.drop(x)
		return nil
	}
	if wait := time.Until(e.ExpiresAt); wait > 0 {
		r.rearm(x, wait)
		return nil
	}
	log := r.log.With().Str("sandbox_id", id).Str("saga", "expiry").Str("policy", x.key.kind).
		Str("phase", string(st.view.Phase)).Uint64("seq", x.env.Seq).Logger()
	// A command of its own, caused by the event that armed the expiry:
	// the policy's one expiry (of the ttl, of this retained state).
	command := firing(x.key, e.ExpiresAt.UTC().Format(time.RFC3339Nano), e.RestoreRef)
	s := &step{saga: "expiry", intent: cause(x, all, command), created: st.created, log: log}
	err = r.record(ctx, s, e)
	switch {
	case errors.Is(err, errRefused):
		// Not due on the gateway's clock, a transient phase to settle
		// first, or the sandbox moved on (read soon, which disarms it).
		log.Info().Err(err).Msg("expiry refused; looking again")
		r.rearm(x, time.Second)
		return nil
	case err != nil:
		return err
	}
	log.Info().Time("expires_at", e.ExpiresAt).Msg("expired")
	r.cfg.Metrics.Expired(x.key.kind)
	r.drop(x)
	return nil
}

// ttlSpent says whether log holds the sandbox's ttl expiry.
func ttlSpent(log []events.Envelope) bool {
	for _, env := range log {
		if env.Type != events.TypeExpired {
			continue
		}
		if e, err := env.Decode(); err == nil && e.(*events.Expired).Policy == events.ExpiryTTL {
			return true
		}
	}
	return false
}

// release is the step of a sandbox.expired: the driver discards every
// retained state invalidated with it (Expired); other actions are their
// own intents' steps.
func (r *Runner) release(ctx context.Context, s *step) error {
	if s.suspender == nil {
		return nil // a driver that cannot suspend retains nothing
	}
	refs := expiredWith(s.later)
	if len(refs) == 0 {
		// Appended in one atomic batch, but a reading of the log may
		// hand the expiry over on its own, as the head: the log says.
		later, err := r.src.Load(ctx, s.spec.SandboxID, s.intent.Seq)
		if err != nil {
			return fmt.Errorf("load %s after %d: %w", s.spec.SandboxID, s.intent.Seq, err)
		}
		refs = expiredWith(later)
	}
	for _, ref := range refs {
		err := r.compensate(ctx, s, "release", "discard", func(ctx context.Context) error { return s.suspender.Discard(ctx, s.spec, ref) })
		if err != nil && !errors.Is(err, compute.ErrUnknownRef) {
			return err
		}
	}
	return nil
}

// expiredWith returns the references of the retained states an expiry
// invalidated: the retained_state_invalidated{reason: Expired} right after
// it.
func expiredWith(later []events.Envelope) []string {
	var refs []string
	for _, e := range later {
		if e.Type != events.TypeRetainedStateInvalidated {
			break
		}
		d, err := e.Decode()
		if err != nil || d.(*events.RetainedStateInvalidated).Reason != events.ReasonExpired {
			break
		}
		refs = append(refs, d.(*events.RetainedStateInvalidated).RestoreRef)
	}
	return refs
}
