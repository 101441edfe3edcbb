package events

import "time"

// Idle (issue 27, item 2; README "Idle and wake"): a sandbox's idle policy,
// set at create or by the server's default, suspends (or stops) it once it
// has been ready with no activity (README "Activity") for After. The
// decision is sandbox.idle_timeout, appended by the gateway at the head of
// the sandbox's log together with the start of its action
// (suspend_requested or stop_requested), both with the actor IdleActor:
// neither is activity (Activity), so an idle suspension does not restart
// the clock it ended.

// Actions of an idle policy and of sandbox.idle_timeout.
const (
	// IdleSuspend suspends the sandbox (the default).
	IdleSuspend = "suspend"
	// IdleStop stops it.
	IdleStop = "stop"
)

// Fallbacks of an idle policy whose action is suspend, for a driver that
// cannot suspend the sandbox.
const (
	// IdleFallbackNone leaves it running, and records nothing (the default).
	IdleFallbackNone = "none"
	// IdleFallbackStop stops it instead.
	IdleFallbackStop = IdleStop
)

// IdleActor is the actor of the events an idle timeout appends
// (sandbox.idle_timeout and the suspend_requested or stop_requested with
// it): the gateway's idle decision, on the sagas' report. Activity passes
// over every event of this actor.
const IdleActor = "sagas:idle"

// IdlePolicy is a sandbox's idle policy, as create's "idle" names it and as
// sandbox.created and the view record it (After as a Go duration, "5m0s").
type IdlePolicy struct {
	After    string `json:"after"`
	Action   string `json:"action,omitempty"`
	Fallback string `json:"fallback,omitempty"`
}

// None says p is no policy (the zero IdlePolicy).
func (p IdlePolicy) None() bool { return p.After == "" }

// Duration is p's After, zero when p is none (or After does not parse).
func (p IdlePolicy) Duration() time.Duration {
	d, err := time.ParseDuration(p.After)
	if err != nil || d <= 0 {
		return 0
	}
	return d
}

// IdleTimeout: the sandbox was ready with no activity for its policy's
// After (a fact of ready). LastActiveAt is the last activity the decision
// saw (its evidence: the view's last_active_at), Action what it does
// (suspend or stop, the fallback's when the driver cannot suspend); the
// event that carries it out follows in the same append.
type IdleTimeout struct {
	Policy       IdlePolicy `json:"policy"`
	LastActiveAt time.Time  `json:"last_active_at"`
	Action       string     `json:"action"`
}

// TypeIdleTimeout is sandbox.idle_timeout (added to CONTRACT §3's types):
// stable, never renamed.
const TypeIdleTimeout = "sandbox.idle_timeout"

func (IdleTimeout) Type() string { return TypeIdleTimeout }

func init() {
	register(func() Event { return &IdleTimeout{} })
}

// ParseIdle resolves a create request's idle policy (req, nil for none):
// def (the server's default, nil for none) when the request names none. An
// unknown value, or an After that is not a positive duration longer than
// window (the activity window: activity is recorded once per window), is
// INVALID_ARGUMENT (an unknown field is refused with the request's body).
func ParseIdle(req, def *IdlePolicy, window time.Duration) (*IdlePolicy, error) {
	switch {
	case req != nil:
		if req.After == "" {
			return nil, Errorf(CodeInvalidArgument, "create: idle: after is required")
		}
		return NewIdlePolicy(req.After, req.Action, req.Fallback, window)
	case def != nil:
		p := *def
		return &p, nil
	}
	return nil, nil
}

// NewIdlePolicy is the policy of after, action and fallback ("" for their
// defaults: suspend, none), or why it is none (INVALID_ARGUMENT; see
// ParseIdle).
func NewIdlePolicy(after, action, fallback string, window time.Duration) (*IdlePolicy, error) {
	d, err := time.ParseDuration(after)
	switch {
	case err != nil || d <= 0:
		return nil, Errorf(CodeInvalidArgument, "create: idle: after %q: want a positive duration (90s, 1h)", after)
	case d <= window:
		return nil, Errorf(CodeInvalidArgument, "create: idle: after %s: want more than the activity window, %s", d, window)
	}
	switch action {
	case "":
		action = IdleSuspend
	case IdleSuspend, IdleStop:
	default:
		return nil, Errorf(CodeInvalidArgument, "create: idle: action %q: want suspend or stop", action)
	}
	switch fallback {
	case "":
		fallback = IdleFallbackNone
	case IdleFallbackNone, IdleFallbackStop:
	default:
		return nil, Errorf(CodeInvalidArgument, "create: idle: fallback %q: want stop or none", fallback)
	}
	return &IdlePolicy{After: d.String(), Action: action, Fallback: fallback}, nil
}

// IdleAction is what policy p does to a sandbox whose driver can (or
// cannot) suspend it: suspend, stop, or "" (nothing: a suspend policy
// without the capability and no fallback).
func IdleAction(p IdlePolicy, canSuspend bool) string {
	switch {
	case p.None():
		return ""
	case p.Action == IdleStop:
		return IdleStop
	case canSuspend:
		return IdleSuspend
	case p.Fallback == IdleFallbackStop:
		return IdleStop
	}
	return ""
}

// IdleSince is when a sandbox's idle clock started: its last activity, or
// when it entered ready if later (time in another phase, suspended say,
// never counts as idle).
func IdleSince(lastActive, readySince time.Time) time.Time {
	if readySince.After(lastActive) {
		return readySince
	}
	return lastActive
}
