package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// by is an event of a given log with its actor (given's have none).
type by struct {
	e     events.Event
	actor string
}

// givenBy is given with actors: event i at second i.
func givenBy(t *testing.T, evs ...by) *Sandbox {
	t.Helper()
	sb := &Sandbox{ID: sid}
	for i, b := range evs {
		env, err := events.NewEnvelope(sid, b.e, events.Meta{Actor: b.actor}, time.Unix(int64(i), 0))
		if err != nil {
			t.Fatal(err)
		}
		env.Seq = uint64(i + 1)
		if err := sb.apply(env); err != nil {
			t.Fatalf("given event %d %s: %v", i, b.e.Type(), err)
		}
	}
	return sb
}

// TestIdled: what an idle timeout the sagas report appends, given the log
// (event i at second i) and the gateway's clock: the timeout with the start
// of its action once the policy's after has passed since the idle clock
// started, and a refusal when it has not, when activity is newer than the
// decision's evidence, when the sandbox is not ready, when one is recorded
// since the last activity, or when it is forged.
func TestIdled(t *testing.T) {
	policy := func(action, fallback string) events.IdlePolicy {
		return events.IdlePolicy{After: "10s", Action: action, Fallback: fallback}
	}
	suspendNone, suspendStop, stop := policy("suspend", "none"), policy("suspend", "stop"), policy("stop", "none")
	withIdle := func(p events.IdlePolicy) *events.Created {
		c := *created
		c.Idle = p
		return &c
	}
	at := func(s float64) time.Time { return time.Unix(0, 0).Add(time.Duration(s * float64(time.Second))).UTC() }
	// Created at 0 (activity), ready at 2: the clock runs from 2, due at 12.
	readyBy := func(p events.IdlePolicy, more ...by) []by {
		return append([]by{{withIdle(p), "http:1"}, {&events.Started{Generation: 1}, "sagas"}, {attached1, "supervisor:1"}}, more...)
	}
	timeout := func(p events.IdlePolicy, last time.Time) *events.IdleTimeout {
		return &events.IdleTimeout{Policy: p, LastActiveAt: last}
	}
	did := func(p events.IdlePolicy, last time.Time, action string) *events.IdleTimeout {
		return &events.IdleTimeout{Policy: p, LastActiveAt: last, Action: action}
	}
	touched := by{&events.Active{Source: events.ActiveTouch, At: at(3)}, "http:1"}
	cases := []struct {
		name       string
		given      []by
		canSuspend bool
		when       *events.IdleTimeout
		now        time.Time
		then       []events.Event
		code       events.Code
	}{
		{name: "due: suspend", given: readyBy(suspendNone), canSuspend: true, when: timeout(suspendNone, at(0)), now: at(12),
			then: []events.Event{did(suspendNone, at(0), "suspend"), &events.SuspendRequested{Generation: 1}}},
		{name: "not due: the clock runs from the entry into ready", given: readyBy(suspendNone), canSuspend: true, when: timeout(suspendNone, at(0)), now: at(11.999),
			code: events.CodeFailedPrecondition},
		{name: "activity newer than the evidence", given: readyBy(suspendNone, touched), canSuspend: true, when: timeout(suspendNone, at(0)), now: at(20),
			code: events.CodeFailedPrecondition},
		{name: "the newer activity's own clock: not due", given: readyBy(suspendNone, touched), canSuspend: true, when: timeout(suspendNone, at(3)), now: at(12.5),
			code: events.CodeFailedPrecondition},
		{name: "the newer activity's own clock: due", given: readyBy(suspendNone, touched), canSuspend: true, when: timeout(suspendNone, at(3)), now: at(13),
			then: []events.Event{did(suspendNone, at(3), "suspend"), &events.SuspendRequested{Generation: 1}}},
		{name: "evidence newer than the last activity (forged)", given: readyBy(suspendNone), canSuspend: true, when: timeout(suspendNone, at(1)), now: at(20),
			code: events.CodeFailedPrecondition},
		{name: "not ready: suspended", given: readyBy(suspendNone, by{&events.SuspendRequested{Generation: 1}, "http:1"}, by{&events.Suspended{Generation: 1, RestoreRef: "r"}, "sagas"}),
			canSuspend: true, when: timeout(suspendNone, at(3)), now: at(60), code: events.CodeFailedPrecondition},
		{name: "not ready: stopping", given: readyBy(stop, by{&events.StopRequested{Generation: 1}, "http:1"}),
			canSuspend: true, when: timeout(stop, at(3)), now: at(60), code: events.CodeFailedPrecondition},
		{name: "no suspend, fallback stop", given: readyBy(suspendStop), when: timeout(suspendStop, at(0)), now: at(12),
			then: []events.Event{did(suspendStop, at(0), "stop"), &events.StopRequested{Generation: 1}}},
		{name: "no suspend, fallback none: left running", given: readyBy(suspendNone), when: timeout(suspendNone, at(0)), now: at(12),
			code: events.CodeFailedPrecondition},
		{name: "can suspend, fallback stop: suspend", given: readyBy(suspendStop), canSuspend: true, when: timeout(suspendStop, at(0)), now: at(12),
			then: []events.Event{did(suspendStop, at(0), "suspend"), &events.SuspendRequested{Generation: 1}}},
		{name: "action stop", given: readyBy(stop), canSuspend: true, when: timeout(stop, at(0)), now: at(12),
			then: []events.Event{did(stop, at(0), "stop"), &events.StopRequested{Generation: 1}}},
		{name: "recorded since the last activity: its suspension rejected", given: readyBy(suspendNone,
			by{did(suspendNone, at(0), "suspend"), events.IdleActor}, by{&events.SuspendRequested{Generation: 1}, events.IdleActor},
			by{&events.SuspendRejected{Generation: 1}, "sagas"}),
			canSuspend: true, when: timeout(suspendNone, at(0)), now: at(60), code: events.CodeFailedPrecondition},
		{name: "another policy (forged)", given: readyBy(suspendNone), canSuspend: true, when: timeout(stop, at(0)), now: at(60),
			code: events.CodeFailedPrecondition},
		{name: "a sandbox with no policy", given: []by{{created, "http:1"}, {&events.Started{Generation: 1}, "sagas"}, {attached1, "supervisor:1"}},
			canSuspend: true, when: timeout(suspendNone, at(0)), now: at(60), code: events.CodeFailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sb := givenBy(t, c.given...)
			got, err := idled(sb, c.when, compute.Capabilities{Suspend: c.canSuspend}, c.now)
			if code := events.CodeOf(err); code != c.code {
				t.Fatalf("error %v (code %q), want code %q", err, code, c.code)
			}
			if !reflect.DeepEqual(got, c.then) && (len(got) != 0 || len(c.then) != 0) {
				t.Fatalf("appends %#v, want %#v", got, c.then)
			}
			phase := sb.Phase
			for _, e := range got {
				next, err := Next(phase, e.Type())
				if err != nil {
					t.Fatalf("idled appends %s that the table refuses: %v", e.Type(), err)
				}
				phase = next
			}
		})
	}
}

// TestIdleTimeoutAcrossInstances: two gateways over one log. The one that
// decides idleness holds a cached state from before a touch the other
// recorded; its decision, on that stale evidence, is refused at the log's
// head and appends nothing. Decided again on the new evidence, once due,
// it appends the timeout and the suspension with the actor sagas:idle,
// which leave last_active_at where it was.
func TestIdleTimeoutAcrossInstances(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	cfg := Config{Idle: events.IdlePolicy{After: "1m0s", Action: events.IdleSuspend, Fallback: events.IdleFallbackNone}}
	newSvc := func() *Service {
		svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, cfg, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		svc.now = clock
		return svc
	}
	decider, toucher := newSvc(), newSvc()
	v := readySandbox(t, decider)
	if v.Idle != cfg.Idle {
		t.Fatalf("view's idle %+v, want the server's default %+v", v.Idle, cfg.Idle)
	}
	evidence := v.LastActiveAt
	now.Add(int64(30 * time.Second))
	if err := toucher.Active(ctx, v.ID, events.ActiveTouch, "http:2", clock()); err != nil {
		t.Fatal(err)
	}
	now.Add(int64(45 * time.Second)) // 75s after the create, 45s after the touch
	cause := events.Envelope{SandboxID: v.ID}
	err := decider.Record(ctx, cause, "sagas", &events.IdleTimeout{Policy: cfg.Idle, LastActiveAt: evidence})
	if events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "newer than") {
		t.Fatalf("idle timeout on the evidence from before the touch: %v; want FAILED_PRECONDITION, activity newer", err)
	}
	if n := countTypes(t, r.store, v.ID)[events.TypeIdleTimeout]; n != 0 {
		t.Fatalf("%d idle timeouts appended, want none", n)
	}
	sb, err := decider.Sandbox(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	touchedAt := sb.View.LastActiveAt
	if !touchedAt.After(evidence) {
		t.Fatalf("last_active_at %s after the touch, want after %s", touchedAt, evidence)
	}
	err = decider.Record(ctx, cause, "sagas", &events.IdleTimeout{Policy: cfg.Idle, LastActiveAt: touchedAt})
	if events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "not idle long enough") {
		t.Fatalf("idle timeout 45s after the touch: %v; want FAILED_PRECONDITION, not idle long enough", err)
	}
	now.Add(int64(15 * time.Second))
	if err := decider.Record(ctx, cause, "sagas", &events.IdleTimeout{Policy: cfg.Idle, LastActiveAt: touchedAt}); err != nil {
		t.Fatalf("idle timeout 60s after the touch: %v", err)
	}
	envs, err := r.store.Load(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	tail := envs[len(envs)-2:]
	if tail[0].Type != events.TypeIdleTimeout || tail[1].Type != events.TypeSuspendRequested ||
		tail[0].Actor != events.IdleActor || tail[1].Actor != events.IdleActor {
		t.Fatalf("log ends %s by %s, %s by %s; want idle_timeout and suspend_requested by %s",
			tail[0].Type, tail[0].Actor, tail[1].Type, tail[1].Actor, events.IdleActor)
	}
	sb, err = decider.Sandbox(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Phase != events.PhaseSuspending || !sb.View.LastActiveAt.Equal(touchedAt) {
		t.Fatalf("after the idle timeout: %s, last_active_at %s; want suspending, %s", sb.Phase, sb.View.LastActiveAt, touchedAt)
	}
}

// TestCreateIdleThroughHTTP: a create's idle policy is checked at the door
// (INVALID_ARGUMENT, nothing created); a good one lands in the view with
// its defaults filled.
func TestCreateIdleThroughHTTP(t *testing.T) {
	r := newRig(t)
	_, base := limitsServer(t, r, Limits{})
	for _, tc := range []struct{ name, body string }{
		{"no after", `{"idle":{"action":"stop"}}`},
		{"a zero after", `{"idle":{"after":"0s"}}`},
		{"a negative after", `{"idle":{"after":"-5m"}}`},
		{"an after within the activity window", `{"idle":{"after":"10s"}}`},
		{"an unknown action", `{"idle":{"after":"5m","action":"delete"}}`},
		{"an unknown fallback", `{"idle":{"after":"5m","fallback":"suspend"}}`},
		{"an unknown field", `{"idle":{"after":"5m","when":"night"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, eb := do(t, "POST", base+"/v1/sandboxes", tc.body)
			if eb.Error == nil || eb.Error.Code != events.CodeInvalidArgument || status != http.StatusBadRequest {
				t.Fatalf("got %d %+v, want INVALID_ARGUMENT", status, eb.Error)
			}
		})
	}
	resp, err := http.Post(base+"/v1/sandboxes", "application/json", strings.NewReader(`{"idle":{"after":"90s","fallback":"stop"}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v events.View
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d, %v", resp.StatusCode, err)
	}
	if want := (events.IdlePolicy{After: "1m30s", Action: "suspend", Fallback: "stop"}); v.Idle != want {
		t.Fatalf("view's idle %+v, want %+v", v.Idle, want)
	}
}
