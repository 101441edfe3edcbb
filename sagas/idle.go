package sagas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Idle (issue 27, item 2; events/idle.go):
//   an event that leaves a sandbox with an idle policy ready
//                                arms its idle timer, at the event's activity (or its own time) + after,
//                                when it is activity or none is armed; any other phase disarms it
//   when it comes due            → load the sandbox's log, decide again on it: not ready, no policy, an
//                                  idle timeout recorded since the last activity, or a driver that cannot
//                                  suspend with fallback none (nothing is recorded: left running) disarms
//                                  it; not due yet (the later of last_active_at and the entry into ready,
//                                  + after) rearms it; else report sandbox.idle_timeout{policy,
//                                  last_active_at} (a command of its own, caused by the event that armed
//                                  it: timer.go) to the gateway, which decides again at the head of the
//                                  log and appends it with suspend_requested or stop_requested (actor
//                                  sagas:idle: no activity), or refuses it (gateway/idle.go)
//     refused                    → look again in a second (newer activity rearms it meanwhile)
//   suspend_requested, stop_requested
//                                → the suspend and stop sagas, as for any client's
//
// Durable as every long timer is (timer.go): kept in Config.Timers, or
// holding the saved position, a restarted runner (or the one that takes
// the sagas' lease) arms it again and fires what came due while it was
// down, once: the gateway refuses a second idle timeout since the same
// last activity.

// trackIdle arms and disarms env's sandbox's idle timer; r.mu is held.
// created is env decoded when it is a sandbox.created, else nil.
func (r *Runner) trackIdle(ctx context.Context, env events.Envelope, created *events.Created) {
	id := env.SandboxID
	k := timerKey{id, kindIdle}
	if env.Phase != events.PhaseReady {
		r.disarm(k)
		return
	}
	c := created
	if c == nil {
		c = r.specs.get(id)
	}
	at := time.Now() // the policy not known here: the job reads it from the log
	if c != nil {
		if c.Idle.None() || !r.drives(c.Node) {
			r.disarm(k)
			return
		}
		at = env.Time
		if e, err := env.Decode(); err == nil {
			if t, ok := events.Activity(env, e); ok {
				at = t
			} else if r.timers[k] != nil {
				return // no activity: the timer armed stands
			}
		}
		at = at.Add(c.Idle.Duration())
	}
	r.arm(ctx, k, env, at)
}

// idleCheck is the job of an idle timer come due: it decides again on the
// sandbox's log and reports the idle timeout (see the top of this file). A
// nil error means it is done with (recorded, rearmed or disarmed); an error
// brings it back after a backoff.
func (r *Runner) idleCheck(ctx context.Context, x *timer) error {
	id := x.key.id
	all, err := r.src.Load(ctx, id, 0)
	if err != nil {
		return fmt.Errorf("load %s: %w", id, err)
	}
	st := fold(all)
	v := st.view
	if st.created != nil {
		// The next events of the sandbox arm from the cache, not the log.
		r.specs.put(id, st.created)
	}
	if st.created == nil || !r.drives(st.created.Node) || v.Idle.None() || v.Phase != events.PhaseReady || idleSpent(all) {
		r.drop(x)
		return nil
	}
	d, err := r.drv.Driver(st.created.Driver)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	action := events.IdleAction(v.Idle, compute.CapabilitiesOf(d, st.created.DriverOptions).Suspend)
	log := r.log.With().Str("sandbox_id", id).Str("saga", "idle").Uint64("seq", x.env.Seq).Logger()
	if action == "" {
		log.Info().Msg("idle, but the driver cannot suspend it and the policy has no fallback: left running")
		r.drop(x)
		return nil
	}
	due := events.IdleSince(v.LastActiveAt, v.PhaseSince).Add(v.Idle.Duration())
	if wait := time.Until(due); wait > 0 {
		r.rearm(x, wait)
		return nil
	}
	// A command of its own, caused by the event that armed the timer: one
	// idle timeout per last activity and idle clock.
	command := firing(x.key, v.LastActiveAt.UTC().Format(time.RFC3339Nano), due.UTC().Format(time.RFC3339Nano))
	s := &step{saga: "idle", intent: cause(x, all, command), created: st.created, log: log}
	err = r.record(ctx, s, &events.IdleTimeout{Policy: v.Idle, LastActiveAt: v.LastActiveAt, Action: action})
	switch {
	case errors.Is(err, errRefused):
		// Activity newer than what this runner read (another instance's,
		// which rearms it), the clocks apart, or the sandbox moved on.
		log.Info().Err(err).Msg("idle timeout refused; looking again")
		r.rearm(x, time.Second)
		return nil
	case err != nil:
		return err
	}
	log.Info().Time("last_active_at", v.LastActiveAt).Str("action", action).Msg("idle")
	r.drop(x)
	return nil
}

// idleSpent says whether log holds an idle timeout since the sandbox's last
// activity.
func idleSpent(log []events.Envelope) bool {
	for i := len(log) - 1; i >= 0; i-- {
		env := log[i]
		if env.Type == events.TypeIdleTimeout {
			return true
		}
		if e, err := env.Decode(); err == nil {
			if _, ok := events.Activity(env, e); ok {
				return false
			}
		}
	}
	return false
}
