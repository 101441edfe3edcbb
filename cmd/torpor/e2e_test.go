package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/internal/busauth"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
)

const waitFor = 20 * time.Second

// startApp runs the real serve wiring on random ports over dir (a new temp
// dir when empty) and stops it at cleanup, after checking every invariant
// of CONTRACT §1 over the whole log it holds then (events/check): every test
// that drives the service checks the log it made.
func startApp(t *testing.T, dir string, mod func(*serveConfig)) *app {
	t.Helper()
	a := startAppUnchecked(t, dir, mod)
	t.Cleanup(func() { checkLog(t, a) })
	return a
}

// checkLog runs the invariant checker over every sandbox's events in a's
// log, unless a was stopped already.
func checkLog(t *testing.T, a *app) {
	t.Helper()
	if !a.Conn().IsConnected() {
		return // stopped by the test; the service started after it checks the same log
	}
	vs, err := check.Replay(context.Background(), a.Store(), check.Options{})
	if err != nil {
		t.Errorf("%v", err)
	}
	for _, v := range vs {
		t.Errorf("the log breaks an invariant: %v", v)
	}
}

// startAppUnchecked is startApp for a test that breaks the log on purpose.
func startAppUnchecked(t *testing.T, dir string, mod func(*serveConfig)) *app {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cfg := serveConfig{Data: dir, HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Fsync: "interval", Node: "local", Deadline: 10 * time.Second, DuplicateWindow: time.Minute, HeartbeatLimit: 15 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	a, err := start(context.Background(), cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(testLogLevel))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	registerToken(a.HTTPAddr(), a.AdminToken())
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = a.Stop()
		}
	})
	return a
}

// sendReport sends r on the report subject of r.SandboxID, as a supervisor
// does, and returns the code of the answer ("" when it was taken).
func sendReport(t *testing.T, nc *nats.Conn, r compute.Report) events.Code {
	t.Helper()
	body, _ := json.Marshal(r)
	reply, err := nc.Request(compute.ReportSubject(r.SandboxID), body, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	var eb events.ErrorBody
	if json.Unmarshal(reply.Data, &eb) == nil && eb.Error != nil {
		return eb.Error.Code
	}
	return ""
}

// busConn is a connection to a's NATS as the service (tests that forge
// what only torpor itself may write, or read it raw).
func busConn(t *testing.T, a *app) *nats.Conn {
	t.Helper()
	return busConnAs(t, a, busauth.Grant{Role: busauth.Service})
}

// busConnAs is a connection to a's NATS as a user holding grants.
func busConnAs(t *testing.T, a *app, grants ...busauth.Grant) *nats.Conn {
	t.Helper()
	opts, err := a.NATSOptionsAs(grants...)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(a.NATSURL(), opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// busCmd sends a command on torpor.cmd.<verb> and decodes the reply: a view
// or a contract error.
func busCmd(t *testing.T, nc *nats.Conn, verb string, body any, hdr nats.Header) (events.View, *events.Error) {
	t.Helper()
	data, _ := json.Marshal(body)
	msg := &nats.Msg{Subject: "torpor.cmd." + verb, Data: data, Header: hdr}
	reply, err := nc.RequestMsg(msg, waitFor)
	if err != nil {
		t.Fatalf("bus %s: %v", verb, err)
	}
	var eb events.ErrorBody
	if json.Unmarshal(reply.Data, &eb) == nil && eb.Error != nil {
		return events.View{}, eb.Error
	}
	var v events.View
	if err := json.Unmarshal(reply.Data, &v); err != nil {
		t.Fatalf("bus %s reply %q: %v", verb, reply.Data, err)
	}
	return v, nil
}

func kvView(t *testing.T, nc *nats.Conn, id string) events.View {
	t.Helper()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), "torpor_phases")
	if err != nil {
		t.Fatalf("kv: %v", err)
	}
	e, err := kv.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("kv get %s: %v", id, err)
	}
	var v events.View
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func mustWait(t *testing.T, c *torpor.Client, id string, p events.Phase) events.View {
	t.Helper()
	v, err := c.Wait(context.Background(), id, p, waitFor)
	if err != nil {
		t.Fatalf("wait %s for %s: %v (view %+v)", id, p, err, v)
	}
	if v.Phase != p {
		t.Fatalf("wait %s: phase %s, want %s", id, v.Phase, p)
	}
	return v
}

// readySim creates a sim sandbox named name and waits until it is ready.
func readySim(t *testing.T, c *torpor.Client, name string) events.View {
	t.Helper()
	v, err := c.Create(context.Background(), torpor.CreateRequest{Name: name, Driver: "sim"}, "")
	if err != nil {
		t.Fatal(err)
	}
	return mustWait(t, c, v.ID, events.PhaseReady)
}

// TestLifecycleOverHTTP drives create → suspend → resume → stop → start →
// delete through the real wiring and reads the KV view at each step.
func TestLifecycleOverHTTP(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	nc := busConn(t, a)
	ctx := context.Background()

	v, err := c.Create(ctx, torpor.CreateRequest{Name: "web", Driver: "sim", Labels: map[string]string{"team": "a"}}, "")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if v.Phase != events.PhaseProvisioning || v.Name != "web" || v.Generation != 1 {
		t.Fatalf("create answered %+v", v)
	}
	id := v.ID
	mustWait(t, c, id, events.PhaseReady)

	steps := []struct {
		verb   string
		target events.Phase
		check  func(events.View) bool
	}{
		{"suspend", events.PhaseSuspended, func(v events.View) bool { return v.Restore.Held && !v.Restore.Consumed }},
		{"resume", events.PhaseReady, func(v events.View) bool {
			return v.Generation == 2 && v.LastOutcome == events.OutcomeRestored && v.Restore.Consumed && !v.Restore.Held
		}},
		{"stop", events.PhaseStopped, func(v events.View) bool { return v.Generation == 2 }},
		{"start", events.PhaseReady, func(v events.View) bool { return v.Generation == 3 }},
	}
	for _, s := range steps {
		if _, err := c.Lifecycle(ctx, s.verb, id, false, ""); err != nil {
			t.Fatalf("%s: %v", s.verb, err)
		}
		mustWait(t, c, id, s.target)
		if kv := kvView(t, nc, id); kv.Phase != s.target || !s.check(kv) {
			t.Fatalf("after %s the KV view is %+v", s.verb, kv)
		}
	}
	if got, err := c.Get(ctx, "web"); err != nil || got.ID != id {
		t.Fatalf("get by name: %+v, %v", got, err)
	}
	if _, err := c.Delete(ctx, id, ""); err != nil {
		t.Fatalf("delete: %v", err)
	}
	mustWait(t, c, id, events.PhaseDeleted)

	h, err := c.History(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range h {
		types = append(types, e.Type)
	}
	for _, want := range []string{"sandbox.created", "supervisor.attached", "sandbox.suspend_requested", "sandbox.suspended",
		"sandbox.resume_requested", "sandbox.retained_state_consumed", "sandbox.resumed", "sandbox.stop_requested",
		"sandbox.stopped", "sandbox.start_requested", "sandbox.delete_requested", "sandbox.deleted"} {
		if !strings.Contains(strings.Join(types, " "), want) {
			t.Errorf("history lacks %s: %v", want, types)
		}
	}
	// The name is free again once the sandbox is deleted.
	if _, err := c.Create(ctx, torpor.CreateRequest{Name: "web"}, ""); err != nil {
		t.Fatalf("create with a deleted sandbox's name: %v", err)
	}
	// What was it when it was first suspended? Fold the log up to that seq.
	for _, e := range h {
		if e.Type == "sandbox.suspended" {
			then, err := c.GetAt(ctx, id, strconvU(e.Seq))
			if err != nil || then.Phase != events.PhaseSuspended || !then.Restore.Held {
				t.Fatalf("at %d: %+v, %v", e.Seq, then, err)
			}
		}
	}
}

func strconvU(u uint64) string { b, _ := json.Marshal(u); return string(b) }

// TestLifecycleOverBus drives the same cycle through the micro service.
func TestLifecycleOverBus(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	nc := busConn(t, a)

	v, e := busCmd(t, nc, "create", map[string]any{"driver": "sim"}, nil)
	if e != nil {
		t.Fatalf("create: %v", e)
	}
	id := v.ID
	mustWait(t, c, id, events.PhaseReady)
	for _, s := range []struct {
		verb   string
		body   map[string]any
		target events.Phase
	}{
		{"suspend", map[string]any{"id": id}, events.PhaseSuspended},
		{"resume", map[string]any{"id": id, "restart_if_restore_fails": true}, events.PhaseReady},
		{"stop", map[string]any{"id": id}, events.PhaseStopped},
		{"start", map[string]any{"id": id}, events.PhaseReady},
		{"delete", map[string]any{"id": id}, events.PhaseDeleted},
	} {
		if _, e := busCmd(t, nc, s.verb, s.body, nil); e != nil {
			t.Fatalf("%s: %v", s.verb, e)
		}
		mustWait(t, c, id, s.target)
		if kv := kvView(t, nc, id); kv.Phase != s.target {
			t.Fatalf("after %s the KV view is %s", s.verb, kv.Phase)
		}
	}
	// The service is discoverable as a micro service named torpor.
	info, err := nc.Request("$SRV.INFO.torpor", nil, waitFor)
	if err != nil || !bytes.Contains(info.Data, []byte(`"torpor.cmd.suspend"`)) {
		t.Fatalf("$SRV.INFO.torpor: %v %s", err, info.Data)
	}
}

// TestUnimplementedSuspendMovesNothing: a driver without the capability
// answers UNIMPLEMENTED and the phase stays.
func TestUnimplementedSuspendMovesNothing(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	ctx := context.Background()
	v, err := c.Create(ctx, torpor.CreateRequest{DriverOptions: map[string]string{"suspend": "unimplemented"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	before := mustWait(t, c, v.ID, events.PhaseReady)
	_, err = c.Lifecycle(ctx, "suspend", v.ID, false, "")
	if code := events.CodeOf(err); code != events.CodeUnimplemented {
		t.Fatalf("suspend: %v (code %s), want UNIMPLEMENTED", err, code)
	}
	h, _ := c.History(ctx, v.ID, before.Seq)
	if len(h) != 0 {
		t.Fatalf("UNIMPLEMENTED appended %d events: %+v", len(h), h)
	}
	if got, _ := c.Get(ctx, v.ID); got.Phase != events.PhaseReady {
		t.Fatalf("phase %s after UNIMPLEMENTED", got.Phase)
	}
}

// httpDo sends a request as a client of the API does (a body as JSON, the
// server's admin token, see tokenTransport) with the headers hdr on top,
// and answers the status and body.
func httpDo(t *testing.T, method, url, body string, hdr map[string]string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

var testLogLevel = zerolog.WarnLevel

// historyCounts returns sandbox id's audit history and how many events of
// each type it holds.
func historyCounts(t *testing.T, c *torpor.Client, id string) ([]torpor.Event, map[string]int) {
	t.Helper()
	h, err := c.History(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range h {
		count[e.Type]++
	}
	return h, count
}

// TestDriversAndLogs: GET /v1/drivers lists each driver with what it can
// do; a sandbox's logs are its workload's output (the sim's: a line per
// change), through HTTP and `torpor logs`; bad tails and unknown sandboxes
// get their contract errors.
func TestDriversAndLogs(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	ctx := context.Background()
	ds, err := c.Drivers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sim *torpor.Driver
	for i := range ds {
		if ds[i].Name == "sim" {
			sim = &ds[i]
		}
	}
	if sim == nil || !sim.Capabilities.Suspend || sim.Capabilities.ResumeElsewhere || sim.Capabilities.Retains == "" {
		t.Fatalf("drivers %+v: want sim, which suspends here only", ds)
	}
	if _, err := c.Create(ctx, torpor.CreateRequest{Driver: "quantum"}, ""); events.CodeOf(err) != events.CodeInvalidArgument || !strings.Contains(err.Error(), "known: ") || !strings.Contains(err.Error(), "sim") {
		t.Fatalf("create with an unknown driver: %v; want INVALID_ARGUMENT naming the known ones", err)
	}
	v, err := c.Create(ctx, torpor.CreateRequest{Name: "talks"}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	acc, err := c.Lifecycle(ctx, "suspend", v.ID, false, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitAfter(ctx, v.ID, events.PhaseSuspended, acc.Seq, waitFor); err != nil {
		t.Fatal(err)
	}
	out, err := c.Logs(ctx, v.ID, 10)
	if err != nil || !strings.Contains(string(out), "sim: generation 1 started") || !strings.Contains(string(out), "suspended behind") {
		t.Fatalf("logs: %q, %v", out, err)
	}
	if out, _ := c.Logs(ctx, v.ID, 1); strings.Count(string(out), "\n") != 1 {
		t.Fatalf("tail 1: %q", out)
	}
	if code, stdout, stderr := cli(t, "http://"+a.HTTPAddr(), "logs", "talks", "--tail", "1"); code != 0 || !strings.Contains(stdout, "suspended behind") {
		t.Fatalf("torpor logs: exit %d, %q %q", code, stdout, stderr)
	}
	for _, bad := range []struct {
		id, tail string
		code     events.Code
	}{
		{v.ID, "0", events.CodeInvalidArgument},
		{v.ID, "lots", events.CodeInvalidArgument},
		{"0193b0a4-0000-7000-8000-00000000beef", "5", events.CodeNotFound},
	} {
		resp, err := http.Get("http://" + a.HTTPAddr() + "/v1/sandboxes/" + bad.id + "/logs?tail=" + bad.tail)
		if err != nil {
			t.Fatal(err)
		}
		var eb events.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if eb.Error == nil || eb.Error.Code != bad.code || resp.StatusCode != bad.code.HTTPStatus() {
			t.Errorf("logs of %s tail %s: %d %+v, want %s", bad.id, bad.tail, resp.StatusCode, eb.Error, bad.code)
		}
	}
}

// TestForwardsBadInput: what each bad forward request gets, over HTTP.
func TestForwardsBadInput(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	v, err := c.Create(context.Background(), torpor.CreateRequest{Name: "fw"}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	base := "http://" + a.HTTPAddr() + "/v1/sandboxes/"
	for _, tc := range []struct {
		name, method, path, body string
		code                     events.Code
	}{
		{"no port", "POST", v.ID + "/forwards", `{"listen":"127.0.0.1:0"}`, events.CodeInvalidArgument},
		{"a port out of range", "POST", v.ID + "/forwards", `{"port":70000}`, events.CodeInvalidArgument},
		{"a listen address that is none", "POST", v.ID + "/forwards", `{"listen":"nowhere","port":80}`, events.CodeInvalidArgument},
		{"malformed JSON", "POST", v.ID + "/forwards", `{"port":`, events.CodeInvalidArgument},
		{"an unknown field", "POST", v.ID + "/forwards", `{"port":80,"proto":"udp"}`, events.CodeInvalidArgument},
		{"an unknown sandbox", "POST", "0193b0a4-0000-7000-8000-00000000beef/forwards", `{"port":80}`, events.CodeNotFound},
		{"a port nothing listens on (no ports option)", "POST", v.ID + "/forwards", `{"port":80}`, events.CodeFailedPrecondition},
		{"an unknown forward", "DELETE", v.ID + "/forwards/0193b0a4-0000-7000-8000-00000000f00d", ``, events.CodeNotFound},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb events.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if eb.Error == nil || eb.Error.Code != tc.code || resp.StatusCode != tc.code.HTTPStatus() {
			t.Errorf("%s: %d %+v, want %s", tc.name, resp.StatusCode, eb.Error, tc.code)
		}
	}
	if got, _ := c.Get(context.Background(), v.ID); len(got.Forwards) != 0 {
		t.Fatalf("refused forwards in the view: %+v", got.Forwards)
	}
}
