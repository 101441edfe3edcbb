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
// Durable as the deadlines are: the saved position never passes an event
// that armed an expiry still armed, so a restarted runner (or the one that
// takes the sagas' lease) reads it again and fires what came due while it
// was down, once: the gateway refuses a second expiry of the same ttl or
// of a state no longer held. The cost: a long ttl holds the position at
// its create, and a restart reads the log again from there.

// expiry is one policy armed for a sandbox, as the runner read the log.
type expiry struct {
	env    events.Envelope // the event that armed it: sandbox.created (ttl) or sandbox.suspended (retention)
	policy string
	timer  *time.Timer
	// parked: a ttl paused while suspended, its timer stopped until an
	// event leaves suspended; left is the newest sequence read with a
	// phase other than suspended (see park).
	parked bool
	left   uint64
}

type expiryKey struct{ id, policy string }

// trackExpiry arms and disarms env's sandbox's expiries; r.mu is held.
// created is env decoded when it is a sandbox.created, else nil.
func (r *Runner) trackExpiry(ctx context.Context, env events.Envelope, created *events.Created) {
	id := env.SandboxID
	switch env.Type {
	case events.TypeCreated:
		if created != nil && !created.ExpiresAt.IsZero() && r.drives(created.Node) {
			r.arm(ctx, env, events.ExpiryTTL, created.ExpiresAt)
		}
	case events.TypeSuspended:
		at := time.Now() // retain_for not known here: the job reads it from the log
		if c := r.specs.get(id); c != nil {
			if c.RetainFor == "" || !r.drives(c.Node) {
				return
			}
			at = events.RetentionEnd(env.Time, c.RetainFor)
		}
		r.arm(ctx, env, events.ExpiryRetention, at)
	case events.TypeExpired:
		if e, err := env.Decode(); err == nil && e.(*events.Expired).Policy == events.ExpiryTTL {
			r.disarm(expiryKey{id, events.ExpiryTTL})
		}
	case events.TypeRetainedStateConsumed, events.TypeRetainedStateDiscarded, events.TypeRetainedStateInvalidated:
		r.disarm(expiryKey{id, events.ExpiryRetention})
	}
	if node := movedTo(env); node != "" {
		// A resume on another node moved the sandbox: its ttl is the
		// runner of that node's from now on (armed by this event; the
		// job reads the ttl from the log when the cache lacks it).
		c := r.specs.get(id)
		switch {
		case !r.drives(node):
			r.disarm(expiryKey{id, events.ExpiryTTL})
		case c == nil:
			r.arm(ctx, env, events.ExpiryTTL, time.Now())
		case !c.ExpiresAt.IsZero():
			r.arm(ctx, env, events.ExpiryTTL, c.ExpiresAt)
		}
	}
	if env.Phase == events.PhaseDeleting || env.Phase == events.PhaseDeleted {
		r.disarm(expiryKey{id, events.ExpiryTTL})
		r.disarm(expiryKey{id, events.ExpiryRetention})
	}
	if x := r.expiries[expiryKey{id, events.ExpiryTTL}]; x != nil && env.Phase != events.PhaseSuspended && env.Phase != events.PhaseNone {
		// Not (or no longer) suspended: a parked ttl is due again, at
		// the time its stay moved it to (the job reads it from the log).
		x.left = max(x.left, env.Seq)
		if x.parked {
			x.parked = false
			x.timer.Reset(0)
		}
	}
}

// park stops x, a ttl paused while suspended as the log read up to head
// says, until an event leaves suspended (trackExpiry); one already read
// past head runs it again at once.
func (r *Runner) park(x *expiry, head uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping || r.expiries[expiryKey{x.env.SandboxID, x.policy}] != x {
		return
	}
	if x.left > head {
		x.timer.Reset(0)
		return
	}
	x.timer.Stop()
	x.parked = true
}

// arm sets the expiry of policy armed by env at at; r.mu is held.
func (r *Runner) arm(ctx context.Context, env events.Envelope, policy string, at time.Time) {
	k := expiryKey{env.SandboxID, policy}
	r.disarm(k)
	x := &expiry{env: env, policy: policy}
	x.timer = time.AfterFunc(time.Until(at), func() { r.expiryDue(ctx, x) })
	r.expiries[k] = x
}

// disarm forgets the expiry k; r.mu is held.
func (r *Runner) disarm(k expiryKey) {
	if x := r.expiries[k]; x != nil {
		x.timer.Stop()
		delete(r.expiries, k)
	}
}

// expiryDue queues x on its sandbox's queue, unless it was disarmed or
// replaced meanwhile.
func (r *Runner) expiryDue(ctx context.Context, x *expiry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping || r.expiries[expiryKey{x.env.SandboxID, x.policy}] != x {
		return
	}
	if r.enqueue(&job{env: x.env, expiry: x}) {
		r.warm.Go(func() { r.work(ctx, x.env.SandboxID) })
	}
}

// rearmExpiry runs x again after d, if it is still armed.
func (r *Runner) rearmExpiry(x *expiry, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopping && r.expiries[expiryKey{x.env.SandboxID, x.policy}] == x {
		x.timer.Reset(d)
	}
}

// closeExpiry forgets x, if it is still armed.
func (r *Runner) closeExpiry(x *expiry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k := (expiryKey{x.env.SandboxID, x.policy}); r.expiries[k] == x {
		r.disarm(k)
	}
}

// expire is the job of an expiry come due: it decides again on the
// sandbox's log and records the expiry (see the top of this file). A nil
// error means it is done with (recorded, rearmed or disarmed); an error
// brings it back after a backoff.
func (r *Runner) expire(ctx context.Context, x *expiry) error {
	id := x.env.SandboxID
	all, err := r.src.Load(ctx, id, 0)
	if err != nil {
		return fmt.Errorf("load %s: %w", id, err)
	}
	st := fold(all)
	if st.created == nil || !r.drives(st.created.Node) {
		r.closeExpiry(x)
		return nil
	}
	var e *events.Expired
	switch v := st.view; x.policy {
	case events.ExpiryTTL:
		if v.ExpiresAt.IsZero() || ttlSpent(all) || v.Phase == events.PhaseDeleting || v.Phase == events.PhaseDeleted {
			r.closeExpiry(x)
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
			r.closeExpiry(x)
			return nil
		}
		e = &events.Expired{Policy: events.ExpiryRetention, ExpiresAt: v.Restore.ExpiresAt, Action: events.OnExpiryStop, RestoreRef: st.held}
	default:
		r.closeExpiry(x)
		return nil
	}
	if wait := time.Until(e.ExpiresAt); wait > 0 {
		r.rearmExpiry(x, wait)
		return nil
	}
	log := r.log.With().Str("sandbox_id", id).Str("saga", "expiry").Str("policy", x.policy).
		Str("phase", string(st.view.Phase)).Uint64("seq", x.env.Seq).Logger()
	s := &step{saga: "expiry", intent: x.env, created: st.created, log: log}
	err = r.record(ctx, s, e)
	switch {
	case errors.Is(err, errRefused):
		// Not due on the gateway's clock, a transient phase to settle
		// first, or the sandbox moved on (read soon, which disarms it).
		log.Info().Err(err).Msg("expiry refused; looking again")
		r.rearmExpiry(x, time.Second)
		return nil
	case err != nil:
		return err
	}
	log.Info().Time("expires_at", e.ExpiresAt).Msg("expired")
	r.cfg.Metrics.Expired(x.policy)
	r.closeExpiry(x)
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
