package gateway

import (
	"context"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// idled decides what an idle timeout the sagas report appends (issue 27,
// item 2; events/idle.go), judged against the state at the head of the
// sandbox's log (a conflict decides again): the idle timeout, then the
// start of its action, suspend_requested or stop_requested. It is refused
// (FAILED_PRECONDITION) unless the policy is the sandbox's, the sandbox is
// ready, no idle timeout is recorded since its last activity, the
// decision's evidence is that last activity (any activity newer than it,
// recorded by any instance, refuses it: the sagas arm again from it), and
// its After has passed at now since the idle clock started (the last
// activity, or the entry into ready if later). A policy that suspends a
// sandbox whose driver cannot, with no fallback, records nothing.
func idled(s *Sandbox, e *events.IdleTimeout, caps compute.Capabilities, now time.Time) ([]events.Event, error) {
	p, last := s.Spec.Idle, s.View.LastActiveAt
	switch {
	case !s.Exists():
		return nil, events.Errorf(events.CodeNotFound, "sandbox %s not found", s.ID)
	case p.None() || e.Policy != p:
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: an idle timeout of policy %+v, but its policy is %+v", s.ID, e.Policy, p)
	case s.Phase != events.PhaseReady:
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s: only a ready sandbox idles", s.ID, s.Phase)
	case s.IdleSpent:
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: an idle timeout is recorded since its last activity", s.ID)
	case last.After(e.LastActiveAt):
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: activity at %s, newer than the idle timeout's evidence %s", s.ID, last.Format(time.RFC3339Nano), e.LastActiveAt.Format(time.RFC3339Nano))
	case !last.Equal(e.LastActiveAt):
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: an idle timeout's evidence %s is not its last activity, %s", s.ID, e.LastActiveAt.Format(time.RFC3339Nano), last.Format(time.RFC3339Nano))
	}
	if due := events.IdleSince(last, s.Entered).Add(p.Duration()); now.Before(due) {
		return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: not idle long enough: its idle policy fires at %s", s.ID, due.Format(time.RFC3339Nano))
	}
	it := &events.IdleTimeout{Policy: p, LastActiveAt: last, Action: events.IdleAction(p, caps.Suspend)}
	switch it.Action {
	case events.IdleSuspend:
		return []events.Event{it, &events.SuspendRequested{Generation: s.Generation}}, nil
	case events.IdleStop:
		return []events.Event{it, &events.StopRequested{Generation: s.Generation}}, nil
	}
	return nil, events.Errorf(events.CodeFailedPrecondition, "sandbox %s: its driver cannot suspend it and its idle policy has no fallback: left running", s.ID)
}

// idle records the idle timeout e the sagas report about cause's sandbox
// (idled), with the actor events.IdleActor whatever the reporter's: what it
// appends is no activity (events.Activity).
func (s *Service) idle(ctx context.Context, cause events.Envelope, e *events.IdleTimeout) error {
	if err := ParseID(cause.SandboxID); err != nil {
		return err
	}
	defer s.lock(cause.SandboxID)()
	if err := s.reach(ctx, cause.SandboxID, cause.Seq); err != nil {
		return err
	}
	var action string
	_, err := s.append(ctx, cause.SandboxID, true, cause.Caused(events.IdleActor), dedupOf(cause), func(sb *Sandbox) ([]events.Event, error) {
		caps, err := s.drivers.Capabilities(sb.Spec.Driver, sb.Spec.DriverOptions)
		if err != nil && sb.Exists() {
			return nil, events.Errorf(events.CodeInternal, "sandbox %s: %v", sb.ID, err)
		}
		evs, err := idled(sb, e, caps, s.now())
		if err == nil {
			action = evs[0].(*events.IdleTimeout).Action
		}
		return evs, err
	})
	if err == nil {
		s.cfg.Metrics.IdleTimeout(action)
	}
	return err
}

// idlePolicy is the idle policy of a create naming req (nil for none):
// events.ParseIdle against the server's default and activity window.
func (s *Service) idlePolicy(req *events.IdlePolicy) (events.IdlePolicy, error) {
	var def *events.IdlePolicy
	if !s.cfg.Idle.None() {
		def = &s.cfg.Idle
	}
	p, err := events.ParseIdle(req, def, s.cfg.ActivityWindow)
	if err != nil || p == nil {
		return events.IdlePolicy{}, err
	}
	return *p, nil
}
