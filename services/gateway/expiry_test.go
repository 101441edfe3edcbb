package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// TestReportedExpiry: what a reported expiry appends, given the log and
// the gateway's clock (given() stamps event i at second i): the expiry
// with the start of its action when due, a refusal when it is not due, of
// a state no longer held, or recorded already.
func TestReportedExpiry(t *testing.T) {
	at := time.Unix(100, 0)
	withTTL := func(on string) *events.Created {
		c := *created
		c.ExpiresAt, c.OnExpiry = at, on
		return &c
	}
	retain := *created
	retain.RetainFor = "10s"
	del, stop := withTTL(events.OnExpiryDelete), withTTL(events.OnExpiryStop)
	rest := func(c *events.Created, evs []events.Event) []events.Event {
		return append([]events.Event{c}, evs[1:]...)
	}
	ttl := func(action string) *events.Expired {
		return &events.Expired{Policy: events.ExpiryTTL, ExpiresAt: at, Action: action}
	}
	heldUntil := time.Unix(4+10, 0).UTC() // suspended at second 4, retain_for 10s
	retention := &events.Expired{Policy: events.ExpiryRetention, ExpiresAt: heldUntil, Action: events.OnExpiryStop, RestoreRef: "ref-1"}
	invalidated := &events.RetainedStateInvalidated{RestoreRef: "ref-1", Reason: events.ReasonExpired}
	cases := []struct {
		name  string
		given []events.Event
		when  events.Event
		now   time.Time
		then  []events.Event
		code  events.Code
	}{
		{name: "ttl delete, ready", given: rest(del, ready), when: ttl(""), now: at,
			then: []events.Event{ttl(events.OnExpiryDelete), &events.DeleteRequested{}}},
		{name: "ttl delete, suspended", given: rest(del, suspended), when: ttl(""), now: at.Add(time.Hour),
			then: []events.Event{ttl(events.OnExpiryDelete), &events.DeleteRequested{}}},
		{name: "ttl stop, ready", given: rest(stop, ready), when: ttl(events.OnExpiryStop), now: at,
			then: []events.Event{ttl(events.OnExpiryStop), &events.StopRequested{Generation: 1}}},
		{name: "ttl stop, suspended: the retained state goes", given: rest(stop, suspended), when: ttl(events.OnExpiryStop), now: at,
			then: []events.Event{ttl(events.OnExpiryStop), invalidated}},
		{name: "ttl stop, stopped already", given: rest(stop, stopped), when: ttl(events.OnExpiryStop), now: at,
			then: []events.Event{ttl(events.ExpiryNone)}},
		{name: "ttl stop, stopping: once it settles", given: rest(stop, stopping), when: ttl(events.OnExpiryStop), now: at,
			code: events.CodeFailedPrecondition},
		{name: "ttl not due", given: rest(del, ready), when: ttl(""), now: at.Add(-time.Nanosecond),
			code: events.CodeFailedPrecondition},
		{name: "ttl of another time (forged)", given: rest(del, ready), when: &events.Expired{Policy: events.ExpiryTTL, ExpiresAt: at.Add(-time.Hour)}, now: at,
			code: events.CodeFailedPrecondition},
		{name: "ttl of a sandbox without one", given: ready, when: ttl(""), now: at,
			code: events.CodeFailedPrecondition},
		{name: "ttl recorded already", given: append(rest(stop, stopped), ttl(events.ExpiryNone)), when: ttl(""), now: at,
			code: events.CodeFailedPrecondition},
		{name: "ttl of a deleted sandbox", given: rest(del, deleted), when: ttl(""), now: at,
			code: events.CodeFailedPrecondition},
		{name: "retention due", given: rest(&retain, suspended), when: retention, now: heldUntil,
			then: []events.Event{retention, invalidated}},
		{name: "retention not due", given: rest(&retain, suspended), when: retention, now: heldUntil.Add(-time.Millisecond),
			code: events.CodeFailedPrecondition},
		{name: "retention of a state consumed", given: rest(&retain, resumed), when: retention, now: heldUntil,
			code: events.CodeFailedPrecondition},
		{name: "retention while a resume is under way", given: rest(&retain, resuming), when: retention, now: heldUntil,
			code: events.CodeFailedPrecondition},
		{name: "retention of a sandbox that keeps its state for ever", given: suspended, when: retention, now: heldUntil,
			code: events.CodeFailedPrecondition},
		{name: "retention of another reference", given: rest(&retain, suspended),
			when: &events.Expired{Policy: events.ExpiryRetention, ExpiresAt: heldUntil, RestoreRef: "ref-0"}, now: heldUntil,
			code: events.CodeFailedPrecondition},
		{name: "an invalidation in suspended with no expiry", given: rest(&retain, suspended),
			when: &events.RetainedStateInvalidated{RestoreRef: "ref-1", Reason: events.ReasonExpired}, now: heldUntil,
			code: events.CodeFailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reportedIs(t, given(t, c.given...), []events.Event{c.when}, c.now, c.code, c.then)
		})
	}
}

// TestCreateExpiryThroughHTTP: a create's ttl, expires_at, on_expiry and
// retain_for are checked at the door (INVALID_ARGUMENT, nothing created);
// good ones land in the created sandbox's view.
func TestCreateExpiryThroughHTTP(t *testing.T) {
	r := newRig(t)
	_, base := limitsServer(t, r, Limits{})
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	cases := []struct {
		name string
		body string
		code events.Code
	}{
		{"both ttl and expires_at", `{"ttl":"1h","expires_at":"` + future + `"}`, events.CodeInvalidArgument},
		{"a negative ttl", `{"ttl":"-5m"}`, events.CodeInvalidArgument},
		{"a zero ttl", `{"ttl":"0s"}`, events.CodeInvalidArgument},
		{"a malformed ttl", `{"ttl":"soon"}`, events.CodeInvalidArgument},
		{"a malformed expires_at", `{"expires_at":"tomorrow"}`, events.CodeInvalidArgument},
		{"an expires_at in the past", `{"expires_at":"` + past + `"}`, events.CodeInvalidArgument},
		{"an unknown on_expiry", `{"ttl":"1h","on_expiry":"suspend"}`, events.CodeInvalidArgument},
		{"an on_expiry without a ttl", `{"on_expiry":"stop"}`, events.CodeInvalidArgument},
		{"a negative retain_for", `{"retain_for":"-1h"}`, events.CodeInvalidArgument},
		{"a malformed retain_for", `{"retain_for":"a week"}`, events.CodeInvalidArgument},
		{"a ttl that pauses without a ttl", `{"ttl_pauses_while_suspended":true}`, events.CodeInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, eb := do(t, "POST", base+"/v1/sandboxes", tc.body)
			if eb.Error == nil || eb.Error.Code != tc.code || status != tc.code.HTTPStatus() {
				t.Fatalf("got %d %+v, want %s", status, eb.Error, tc.code)
			}
		})
	}

	resp, err := http.Post(base+"/v1/sandboxes", "application/json", strings.NewReader(`{"expires_at":"`+future+`","on_expiry":"stop","retain_for":"90m","ttl_pauses_while_suspended":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v events.View
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d, %v", resp.StatusCode, err)
	}
	if got := v.ExpiresAt.Format(time.RFC3339); got != future || v.OnExpiry != events.OnExpiryStop || v.RetainFor != "1h30m0s" {
		t.Fatalf("view expires_at %s, on_expiry %q, retain_for %q; want %s, stop, 1h30m0s", got, v.OnExpiry, v.RetainFor, future)
	}
	if !v.TTLPausesWhileSuspended || v.ExpiryPaused {
		t.Fatalf("view ttl_pauses_while_suspended %v, expiry_paused %v; want true, false", v.TTLPausesWhileSuspended, v.ExpiryPaused)
	}
}

// TestReportedExpiryPaused: with ttl_pauses_while_suspended, the ttl is
// the view's expires_at, created's moved later by the time spent
// suspended (event i at second i: suspended at 4, resumed at 5), and none
// is due while suspended; a report at created's time, or before the
// moved one on the gateway's clock, is refused.
func TestReportedExpiryPaused(t *testing.T) {
	at := time.Unix(100, 0)
	pauses := *created
	pauses.ExpiresAt, pauses.OnExpiry, pauses.TTLPausesWhileSuspended = at, events.OnExpiryDelete, true
	plain := pauses
	plain.TTLPausesWhileSuspended = false
	rest := func(c *events.Created, evs []events.Event) []events.Event {
		return append([]events.Event{c}, evs[1:]...)
	}
	ttl := func(at time.Time) *events.Expired {
		return &events.Expired{Policy: events.ExpiryTTL, ExpiresAt: at, Action: events.OnExpiryDelete}
	}
	moved := at.Add(time.Second) // one second suspended, 4 to 5
	cases := []struct {
		name  string
		given []events.Event
		when  events.Event
		now   time.Time
		then  []events.Event
		code  events.Code
	}{
		{name: "suspended: paused, long past created's", given: rest(&pauses, suspended), when: ttl(at), now: at.Add(time.Hour),
			code: events.CodeFailedPrecondition},
		{name: "resumed: moved by the stay", given: rest(&pauses, resumed), when: ttl(moved), now: moved,
			then: []events.Event{ttl(moved), &events.DeleteRequested{}}},
		{name: "resumed: premature on the gateway's clock", given: rest(&pauses, resumed), when: ttl(moved), now: moved.Add(-time.Millisecond),
			code: events.CodeFailedPrecondition},
		{name: "resumed: at created's time", given: rest(&pauses, resumed), when: ttl(at), now: moved,
			code: events.CodeFailedPrecondition},
		{name: "without the option: created's, suspended or not", given: rest(&plain, suspended), when: ttl(at), now: at,
			then: []events.Event{ttl(at), &events.DeleteRequested{}}},
		{name: "without the option: not moved", given: rest(&plain, resumed), when: ttl(moved), now: moved,
			code: events.CodeFailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reportedIs(t, given(t, c.given...), []events.Event{c.when}, c.now, c.code, c.then)
		})
	}
}
