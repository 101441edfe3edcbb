package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/node"
)

// TestBadInputOverHTTP says what each kind of bad input gets, and that the
// service keeps serving after each one.
func TestBadInputOverHTTP(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	ctx := context.Background()
	v, err := c.Create(ctx, torpor.CreateRequest{Name: "taken"}, "")
	if err != nil {
		t.Fatal(err)
	}
	ready := mustWait(t, c, v.ID, events.PhaseReady)
	base := "http://" + a.HTTPAddr()
	unknown := "0193b0a4-0000-7000-8000-0000000000ff"
	huge := `{"name":"x","labels":{"k":"` + strings.Repeat("a", 300<<10) + `"}}`

	cases := []struct {
		name, method, path, body string
		status                   int
		code                     events.Code
	}{
		{"malformed JSON", "POST", "/v1/sandboxes", `{"name":`, 400, events.CodeInvalidArgument},
		{"not an object", "POST", "/v1/sandboxes", `[1,2]`, 400, events.CodeInvalidArgument},
		{"trailing data", "POST", "/v1/sandboxes", `{"name":"a1"} {}`, 400, events.CodeInvalidArgument},
		{"unknown field", "POST", "/v1/sandboxes", `{"name":"a2","colour":"red"}`, 400, events.CodeInvalidArgument},
		{"oversized body", "POST", "/v1/sandboxes", huge, 400, events.CodeInvalidArgument},
		{"unknown driver", "POST", "/v1/sandboxes", `{"driver":"quantum"}`, 400, events.CodeInvalidArgument},
		{"bad driver option", "POST", "/v1/sandboxes", `{"driver_options":{"suspend":"maybe"}}`, 400, events.CodeInvalidArgument},
		{"bad name", "POST", "/v1/sandboxes", `{"name":"Has Spaces"}`, 400, events.CodeInvalidArgument},
		{"name in use", "POST", "/v1/sandboxes", `{"name":"taken"}`, 409, events.CodeAlreadyExists},
		{"unknown sandbox", "POST", "/v1/sandboxes/" + unknown + "/suspend", ``, 404, events.CodeNotFound},
		{"unknown name", "GET", "/v1/sandboxes/nobody", ``, 404, events.CodeNotFound},
		{"invalid id", "POST", "/v1/sandboxes/not-a-uuid/suspend", ``, 400, events.CodeInvalidArgument},
		{"invalid id with a subject wildcard", "POST", "/v1/sandboxes/a.*.%3E/stop", ``, 400, events.CodeInvalidArgument},
		{"wrong phase", "POST", "/v1/sandboxes/" + v.ID + "/resume", ``, 409, events.CodeFailedPrecondition},
		{"option of another verb", "POST", "/v1/sandboxes/" + v.ID + "/stop", `{"restart_if_restore_fails":true}`, 400, events.CodeInvalidArgument},
		{"node, an option of resume", "POST", "/v1/sandboxes/" + v.ID + "/suspend", `{"node":"n2"}`, 400, events.CodeInvalidArgument},
		{"body id differs from path", "POST", "/v1/sandboxes/" + v.ID + "/stop", `{"id":"` + unknown + `"}`, 400, events.CodeInvalidArgument},
		{"malformed lifecycle body", "POST", "/v1/sandboxes/" + v.ID + "/stop", `{`, 400, events.CodeInvalidArgument},
		{"bad at", "GET", "/v1/sandboxes/" + v.ID + "?at=yesterday", ``, 400, events.CodeInvalidArgument},
		{"bad after", "GET", "/v1/sandboxes/" + v.ID + "/events?after=-1", ``, 400, events.CodeInvalidArgument},
		{"bad wait phase", "GET", "/v1/sandboxes/" + v.ID + "/wait?phase=asleep", ``, 400, events.CodeInvalidArgument},
		{"bad wait after", "GET", "/v1/sandboxes/" + v.ID + "/wait?phase=ready&after=x", ``, 400, events.CodeInvalidArgument},
		{"bad wait timeout", "GET", "/v1/sandboxes/" + v.ID + "/wait?phase=ready&timeout=soon", ``, 400, events.CodeInvalidArgument},
		{"wait times out", "GET", "/v1/sandboxes/" + v.ID + "/wait?phase=stopped&timeout=50ms", ``, 504, events.CodeDeadlineExceeded},
		{"wait on an unknown sandbox", "GET", "/v1/sandboxes/" + unknown + "/wait?phase=ready", ``, 404, events.CodeNotFound},
		{"wait on an invalid id", "GET", "/v1/sandboxes/not-a-uuid/wait?phase=ready", ``, 400, events.CodeInvalidArgument},
		{"bad list phase", "GET", "/v1/sandboxes?phase=asleep", ``, 400, events.CodeInvalidArgument},
		{"bad list limit", "GET", "/v1/sandboxes?limit=0", ``, 400, events.CodeInvalidArgument},
		{"bad list cursor", "GET", "/v1/sandboxes?cursor=!!!", ``, 400, events.CodeInvalidArgument},
		{"no route", "GET", "/v2/everything", ``, 404, events.CodeNotFound},
		{"a write to the server's own description", "PUT", "/v1/server", `{"deadline_seconds":1}`, 404, events.CodeNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := httpDo(t, tc.method, base+tc.path, tc.body, nil)
			var eb events.ErrorBody
			if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil {
				t.Fatalf("status %d body %q: not a contract error", status, body)
			}
			if status != tc.status || eb.Error.Code != tc.code || eb.Error.Message == "" {
				t.Fatalf("got %d %s %q, want %d %s", status, eb.Error.Code, eb.Error.Message, tc.status, tc.code)
			}
		})
	}
	// A watch resumed from something that is no seq.
	status, body := httpDo(t, "GET", base+"/v1/watch", "", map[string]string{"Last-Event-ID": "yesterday"})
	var eb events.ErrorBody
	if json.Unmarshal(body, &eb) != nil || eb.Error == nil || status != 400 || eb.Error.Code != events.CodeInvalidArgument {
		t.Fatalf("watch with Last-Event-ID yesterday: %d %q, want 400 INVALID_ARGUMENT", status, body)
	}
	// Nothing was lost or added: the sandbox is as it was, and the service serves.
	if h, _ := c.History(ctx, v.ID, ready.Seq); len(h) != 0 {
		t.Fatalf("bad input appended %d events", len(h))
	}
	if _, err := c.Create(ctx, torpor.CreateRequest{}, ""); err != nil {
		t.Fatalf("create after bad input: %v", err)
	}
}

// TestBadInputOverBus: the same errors come back on the bus, as the HTTP body.
func TestBadInputOverBus(t *testing.T) {
	a := startApp(t, "", nil)
	nc := busConn(t, a)
	v, e := busCmd(t, nc, "create", map[string]any{}, nil)
	if e != nil {
		t.Fatal(e)
	}
	raw := func(verb, body string) *events.Error {
		t.Helper()
		reply, err := nc.Request("torpor.cmd."+verb, []byte(body), waitFor)
		if err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
		var eb events.ErrorBody
		if json.Unmarshal(reply.Data, &eb) != nil || eb.Error == nil {
			return nil
		}
		if got := reply.Header.Get("Nats-Service-Error-Code"); got != string(eb.Error.Code) {
			t.Errorf("micro error header %q, body code %s", got, eb.Error.Code)
		}
		return eb.Error
	}
	cases := []struct {
		name, verb, body string
		code             events.Code
	}{
		{"malformed JSON", "create", `{"name":`, events.CodeInvalidArgument},
		{"unknown field", "suspend", `{"id":"` + v.ID + `","now":true}`, events.CodeInvalidArgument},
		{"missing id", "stop", `{}`, events.CodeInvalidArgument},
		{"invalid id", "stop", `{"id":"torpor.>"}`, events.CodeInvalidArgument},
		{"unknown sandbox", "stop", `{"id":"0193b0a4-0000-7000-8000-0000000000ff"}`, events.CodeNotFound},
		{"oversized", "create", `{"name":"` + strings.Repeat("a", 300<<10) + `"}`, events.CodeInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := raw(tc.verb, tc.body)
			if got == nil || got.Code != tc.code {
				t.Fatalf("got %+v, want %s", got, tc.code)
			}
		})
	}
}

// TestDuplicateCommandsLandOnce: a command retried with its idempotency key,
// over HTTP or the bus, is in the log exactly once.
func TestDuplicateCommandsLandOnce(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	nc := busConn(t, a)
	ctx := context.Background()

	first, err := c.Create(ctx, torpor.CreateRequest{Name: "once"}, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Create(ctx, torpor.CreateRequest{Name: "once"}, "key-1")
	if err != nil || again.ID != first.ID {
		t.Fatalf("retried create: %+v, %v; want sandbox %s", again, err, first.ID)
	}
	mustWait(t, c, first.ID, events.PhaseReady)
	for i := 0; i < 3; i++ {
		if _, err := c.Lifecycle(ctx, "suspend", first.ID, false, "sus-1"); err != nil {
			t.Fatalf("suspend try %d: %v", i, err)
		}
		if _, e := busCmd(t, nc, "suspend", map[string]string{"id": first.ID}, nats.Header{"Torpor-Idempotency-Key": []string{"sus-1"}}); e != nil {
			t.Fatalf("bus suspend try %d: %v", i, e)
		}
	}
	mustWait(t, c, first.ID, events.PhaseSuspended)
	_, count := historyCounts(t, c, first.ID)
	if count["sandbox.created"] != 1 || count["sandbox.suspend_requested"] != 1 || count["sandbox.suspended"] != 1 {
		t.Fatalf("history counts %v, want one create, one suspend request, one suspended", count)
	}
}

// TestStaleGenerationReportIsFenced: a supervisor report of an old
// generation, or with a wrong credential, is refused and changes nothing.
func TestStaleGenerationReportIsFenced(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	nc := busConn(t, a)
	ctx := context.Background()
	v, _ := c.Create(ctx, torpor.CreateRequest{}, "")
	mustWait(t, c, v.ID, events.PhaseReady)
	if _, err := c.Lifecycle(ctx, "suspend", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseSuspended)
	if _, err := c.Lifecycle(ctx, "resume", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	now := mustWait(t, c, v.ID, events.PhaseReady)

	js, _ := jetstream.New(nc)
	creds, err := node.Credentials(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	report := func(gen int64, cred, kind string) events.Code {
		return sendReport(t, nc, compute.Report{SandboxID: v.ID, Generation: gen, Credential: cred, Kind: kind, ExitCode: 7})
	}
	if code := report(1, creds.Mint(v.ID, 1), "exited"); code != events.CodeFailedPrecondition {
		t.Fatalf("exit of generation 1 after the resume: %q, want FAILED_PRECONDITION", code)
	}
	if code := report(2, "forged", "exited"); code != events.CodeUnauthenticated {
		t.Fatalf("exit with a forged credential: %q, want UNAUTHENTICATED", code)
	}
	if code := report(2, creds.Mint(v.ID, 2), "attached"); code != "" {
		t.Fatalf("repeated attach of the current generation: %q, want accepted", code)
	}
	if h, _ := c.History(ctx, v.ID, now.Seq); len(h) != 0 {
		t.Fatalf("fenced reports appended %+v", h)
	}
	// The current generation's exit is recorded, with its code.
	if code := report(2, creds.Mint(v.ID, 2), "exited"); code != "" {
		t.Fatalf("exit of the current generation: %q", code)
	}
	got := mustWait(t, c, v.ID, events.PhaseError)
	if got.ExitCode == nil || *got.ExitCode != 7 || got.Reason != events.ReasonMainProcessExited {
		t.Fatalf("after exit: %+v", got)
	}
}

// TestForeignMessagesInTheStream: whatever any NATS client publishes on a
// sandbox's subject that is not a torpor event this build reads (not JSON,
// no or another type header, an unknown type, a schema from the future,
// another sandbox's id) is skipped by the projection, the history, a point in
// time view and the commands: the sandbox keeps working, other sandboxes are
// unaffected.
func TestForeignMessagesInTheStream(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	nc := busConn(t, a)
	ctx := context.Background()
	v, _ := c.Create(ctx, torpor.CreateRequest{}, "")
	ready := mustWait(t, c, v.ID, events.PhaseReady)

	js, _ := jetstream.New(nc)
	future, _ := json.Marshal(events.Envelope{ID: "future-1", SandboxID: v.ID, Type: "sandbox.from_the_future", Schema: 9, Data: json.RawMessage(`{}`)})
	later, _ := json.Marshal(events.Envelope{ID: "later-1", SandboxID: v.ID, Type: "sandbox.stopped", Schema: 9, Data: json.RawMessage(`{}`)})
	elsewhere, _ := json.Marshal(events.Envelope{ID: "else-1", SandboxID: "0193b0a4-0000-7000-8000-00000000dead", Type: "sandbox.stopped", Schema: 1, Data: json.RawMessage(`{}`)})
	typed := func(typ string) nats.Header { return nats.Header{jsstore.HeaderType: []string{typ}} }
	for _, m := range []*nats.Msg{
		{Data: future, Header: typed("sandbox.from_the_future")},
		{Data: later, Header: typed("sandbox.stopped")},
		{Data: elsewhere, Header: typed("sandbox.stopped")},
		{Data: []byte("\x00\xffnot json"), Header: typed("sandbox.stopped")},
		{Data: []byte(`{"id":"no-header"}`)},
	} {
		m.Subject = jsstore.Subject(v.ID)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// A later sandbox's events are projected, so the projection got past them.
	other, _ := c.Create(ctx, torpor.CreateRequest{}, "")
	mustWait(t, c, other.ID, events.PhaseReady)
	if kv := kvView(t, nc, v.ID); kv.Seq != ready.Seq || kv.Phase != events.PhaseReady {
		t.Fatalf("projection folded a foreign message: %+v", kv)
	}
	acc, err := c.Lifecycle(ctx, "stop", v.ID, false, "")
	if err != nil {
		t.Fatalf("stop after foreign messages: %v", err)
	}
	if _, err := c.WaitAfter(ctx, v.ID, events.PhaseStopped, acc.Seq, waitFor); err != nil {
		t.Fatalf("wait for stopped: %v", err)
	}
	h, count := historyCounts(t, c, v.ID)
	if len(h) != 5 || count["sandbox.stopped"] != 1 {
		t.Fatalf("history %v: want created, started, attached, stop_requested, stopped only", count)
	}
	if at, err := c.GetAt(ctx, v.ID, fmt.Sprint(ready.Seq+3)); err != nil || at.Phase != events.PhaseReady {
		t.Fatalf("view at a foreign message's seq: %+v, %v; want ready", at, err)
	}
	if n := a.Store().Foreign(); n != 5 {
		t.Errorf("store counted %d foreign messages, want 5", n)
	}
}

var _ = http.StatusOK
