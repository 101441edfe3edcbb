package events

import (
	"testing"
	"time"
)

// TestParseIdle: create's idle policy, its defaults and what it refuses.
func TestParseIdle(t *testing.T) {
	def := &IdlePolicy{After: "10m0s", Action: IdleStop, Fallback: IdleFallbackNone}
	cases := []struct {
		name string
		req  *IdlePolicy
		def  *IdlePolicy
		want *IdlePolicy // nil with ok: none
		ok   bool
	}{
		{"none, no default", nil, nil, nil, true},
		{"none takes the default", nil, def, def, true},
		{"after only: suspend, fallback none", &IdlePolicy{After: "90s"}, def, &IdlePolicy{After: "1m30s", Action: "suspend", Fallback: "none"}, true},
		{"stop", &IdlePolicy{After: "1h", Action: "stop"}, nil, &IdlePolicy{After: "1h0m0s", Action: "stop", Fallback: "none"}, true},
		{"fallback stop", &IdlePolicy{After: "2m", Fallback: "stop"}, nil, &IdlePolicy{After: "2m0s", Action: "suspend", Fallback: "stop"}, true},
		{"no after", &IdlePolicy{Action: "stop"}, nil, nil, false},
		{"zero after", &IdlePolicy{After: "0s"}, nil, nil, false},
		{"negative after", &IdlePolicy{After: "-1m"}, nil, nil, false},
		{"after not a duration", &IdlePolicy{After: "soon"}, nil, nil, false},
		{"after within the activity window", &IdlePolicy{After: "30s"}, nil, nil, false},
		{"unknown action", &IdlePolicy{After: "1m", Action: "delete"}, nil, nil, false},
		{"unknown fallback", &IdlePolicy{After: "1m", Fallback: "suspend"}, nil, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseIdle(c.req, c.def, 30*time.Second)
			if !c.ok {
				if CodeOf(err) != CodeInvalidArgument {
					t.Fatalf("got %+v, %v; want INVALID_ARGUMENT", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestIdleAction: what a policy does with and without a driver that can
// suspend.
func TestIdleAction(t *testing.T) {
	cases := []struct {
		action, fallback string
		canSuspend       bool
		want             string
	}{
		{"suspend", "none", true, "suspend"},
		{"suspend", "stop", true, "suspend"},
		{"suspend", "none", false, ""},
		{"suspend", "stop", false, "stop"},
		{"stop", "none", true, "stop"},
		{"stop", "none", false, "stop"},
	}
	for _, c := range cases {
		p := &IdlePolicy{After: "1m0s", Action: c.action, Fallback: c.fallback}
		if got := IdleAction(*p, c.canSuspend); got != c.want {
			t.Errorf("IdleAction(%s, fallback %s, can suspend %v) = %q, want %q", c.action, c.fallback, c.canSuspend, got, c.want)
		}
	}
	if got := IdleAction(IdlePolicy{}, true); got != "" {
		t.Errorf("IdleAction(nil) = %q, want none", got)
	}
}

// TestIdleTimeoutIsNoActivity: the idle_timeout and the suspend_requested
// or stop_requested appended with it (actor IdleActor) leave
// last_active_at where it was; the same intents from a client move it.
func TestIdleTimeoutIsNoActivity(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 0).UTC() }
	p := IdlePolicy{After: "1m0s", Action: IdleSuspend, Fallback: IdleFallbackNone}
	steps := []struct {
		e      Event
		actor  string
		active time.Time
	}{
		{&Created{Name: "a", Generation: 1, Idle: p}, "http:1", at(10)},
		{&SupervisorAttached{Generation: 1}, "supervisor:1", at(10)},
		{&IdleTimeout{Policy: p, LastActiveAt: at(10), Action: IdleSuspend}, IdleActor, at(10)},
		{&SuspendRequested{Generation: 1}, IdleActor, at(10)},
		{&SuspendRejected{Generation: 1}, "sagas", at(10)},
		{&IdleTimeout{Policy: p, LastActiveAt: at(10), Action: IdleStop}, IdleActor, at(10)},
		{&StopRequested{Generation: 1}, IdleActor, at(10)},
		{&Stopped{Generation: 1}, "sagas", at(10)},
		{&StartRequested{Generation: 2}, "http:1", at(18)},
		{&SupervisorAttached{Generation: 2}, "supervisor:2", at(18)},
		{&SuspendRequested{Generation: 2}, "http:1", at(20)},
	}
	var v View
	for i, s := range steps {
		en, err := NewEnvelope("s1", s.e, Meta{Actor: s.actor}, at(int64(10+i)))
		if err != nil {
			t.Fatal(err)
		}
		en.Seq = uint64(i + 1)
		if _, err := v.Apply(en); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if !v.LastActiveAt.Equal(s.active) {
			t.Errorf("after %T by %s (step %d): last_active_at %s, want %s", s.e, s.actor, i, v.LastActiveAt, s.active)
		}
	}
	if v.Idle != p {
		t.Errorf("view's idle %+v, want %+v", v.Idle, p)
	}
}
