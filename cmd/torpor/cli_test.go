package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
)

// cli runs the torpor binary's entry point against a server.
func cli(t *testing.T, server string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	pre := []string{"--server", server}
	if tok := tokenFor(server); tok != "" {
		pre = append(pre, "--token", tok)
	}
	code := run(context.Background(), append(pre, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// TestCLI drives the client verbs by name, waiting for target phases, and
// checks the exit status and stderr of failures.
func TestCLI(t *testing.T) {
	a := startApp(t, "", nil)
	srv := "http://" + a.HTTPAddr()
	for _, args := range [][]string{
		{"create", "cli-demo", "--label", "team=a"},
		{"suspend", "cli-demo"},
		{"resume", "cli-demo", "--restart-if-restore-fails"},
		{"stop", "cli-demo"},
		{"start", "cli-demo"},
	} {
		if code, _, stderr := cli(t, srv, args...); code != 0 {
			t.Fatalf("torpor %v: exit %d, %s", args, code, stderr)
		}
	}
	code, out, _ := cli(t, srv, "get", "cli-demo", "-o", "json")
	var v events.View
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Phase != events.PhaseReady || v.Generation != 3 || v.Labels["team"] != "a" {
		t.Fatalf("get: exit %d, %s", code, out)
	}
	if code, out, _ := cli(t, srv, "history", "cli-demo"); code != 0 || !strings.Contains(out, "sandbox.retained_state_consumed") {
		t.Fatalf("history: exit %d\n%s", code, out)
	}
	code, out, _ = cli(t, srv, "create", "cli-expiry", "--ttl", "1h", "--on-expiry", "stop", "--retain-for", "5m", "--ttl-pauses-while-suspended", "--no-wait", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.ExpiresAt.IsZero() || v.OnExpiry != "stop" || v.RetainFor != "5m0s" || !v.TTLPausesWhileSuspended {
		t.Fatalf("create with an expiry: exit %d, %s", code, out)
	}
	code, out, _ = cli(t, srv, "create", "cli-idle", "--idle-after", "1h", "--idle-fallback", "stop", "--no-wait", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Idle != (events.IdlePolicy{After: "1h0m0s", Action: "suspend", Fallback: "stop"}) {
		t.Fatalf("create with an idle policy: exit %d, %s", code, out)
	}
	if code, out, _ := cli(t, srv, "list", "--phase", "ready"); code != 0 || !strings.Contains(out, "cli-demo") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"resume"}, "torpor: INVALID_ARGUMENT: "},
		{[]string{"suspend", "cli-demo", "--bogus"}, "torpor: INVALID_ARGUMENT: "},
		{[]string{"resume", "cli-demo"}, "torpor: FAILED_PRECONDITION: "},
		{[]string{"get", "nobody"}, "torpor: NOT_FOUND: "},
		{[]string{"create", "--opt", "latency"}, "torpor: INVALID_ARGUMENT: "},
		{[]string{"create", "--ttl", "1h", "--expires-at", "2099-01-01T00:00:00Z"}, "torpor: INVALID_ARGUMENT: create: ttl and expires_at"},
	} {
		code, _, stderr := cli(t, srv, c.args...)
		if code == 0 || !strings.HasPrefix(stderr, c.want) {
			t.Errorf("torpor %v: exit %d, stderr %q; want non-zero and %q", c.args, code, stderr, c.want)
		}
	}
	if code, _, stderr := cli(t, "http://127.0.0.1:1", "list"); code == 0 || !strings.HasPrefix(stderr, "torpor: UNAVAILABLE: ") {
		t.Errorf("no server: exit %d, %q", code, stderr)
	}
}

// TestCheckVerb: `torpor check` reads the live log through the server and
// exits 0 when every invariant holds; a log that breaks one (an event any
// NATS client could append, which the projection folds) makes it print the
// violation and exit non-zero; a sandbox past the deadline in a transient
// phase is reported stuck.
func TestCheckVerb(t *testing.T) {
	a := startAppUnchecked(t, "", nil)
	srv := "http://" + a.HTTPAddr()
	for _, args := range [][]string{{"create", "fine"}, {"create", "broken"}, {"suspend", "broken"}, {"resume", "broken"}} {
		if code, _, stderr := cli(t, srv, args...); code != 0 {
			t.Fatalf("torpor %v: exit %d, %s", args, code, stderr)
		}
	}
	if code, out, stderr := cli(t, srv, "check"); code != 0 || !strings.Contains(out, "checked 2 sandboxes") || !strings.Contains(out, ": 0 violations") {
		t.Fatalf("check of a clean log: exit %d\n%s%s", code, out, stderr)
	}
	// A forged suspended on the consumed reference: the table refuses it
	// in ready, so every reader passes over it and the log still holds.
	// An exit report of the old generation, which the table takes: the
	// check finds it (invariant 3).
	c := appClient(a)
	v, err := c.Get(context.Background(), "broken")
	if err != nil {
		t.Fatal(err)
	}
	h, _ := c.History(context.Background(), v.ID, 0)
	var ref string
	for _, e := range h {
		if e.Type == events.TypeSuspended {
			var s events.Suspended
			_ = json.Unmarshal(e.Data, &s)
			ref = s.RestoreRef
		}
	}
	env, _ := events.NewEnvelope(v.ID, &events.Suspended{Generation: 2, RestoreRef: ref}, events.Meta{Actor: "intruder"}, time.Now())
	env.Phase = events.PhaseSuspended
	last, err := a.Store().Append(context.Background(), v.ID, h[len(h)-1].Seq, env)
	if err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := cli(t, srv, "check", "broken"); code != 0 || !strings.Contains(out, ": 0 violations") {
		t.Fatalf("check of a log with a forged event: exit %d\n%s%s", code, out, stderr)
	}
	old, _ := events.NewEnvelope(v.ID, &events.Exited{Generation: 1, Code: 3}, events.Meta{Actor: "intruder"}, time.Now())
	if _, err := a.Store().Append(context.Background(), v.ID, last, old); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := cli(t, srv, "check", "broken")
	if code == 0 || !strings.Contains(out, "invariant 3") || !strings.Contains(stderr, "torpor: INTERNAL: ") {
		t.Fatalf("check of a broken log: exit %d\n%s%s", code, out, stderr)
	}
	code, out, _ = cli(t, srv, "check", "-o", "json")
	var vs []check.Violation
	if code == 0 || json.Unmarshal([]byte(out), &vs) != nil || len(vs) != 1 || vs[0].SandboxID != v.ID || vs[0].Invariant != check.GenerationsFenced {
		t.Fatalf("check -o json: exit %d\n%s %v", code, out, vs)
	}
	// A supervisor that never attaches: stuck, by a deadline shorter than the server's.
	if code, _, stderr := cli(t, srv, "create", "late", "--opt", "attach=never", "--no-wait"); code != 0 {
		t.Fatalf("create: %s", stderr)
	}
	code, out, _ = cli(t, srv, "check", "late", "--deadline", "1ns", "--slack", "0s")
	if code == 0 || !strings.Contains(out, "invariant 5") || !strings.Contains(out, "provisioning") {
		t.Fatalf("check of a stuck sandbox: exit %d\n%s", code, out)
	}
	if code, _, stderr := cli(t, srv, "check", "nobody"); code == 0 || !strings.HasPrefix(stderr, "torpor: NOT_FOUND: ") {
		t.Fatalf("check of an unknown sandbox: exit %d, %s", code, stderr)
	}
	checkFromTheLog(t, a, srv)
}

// checkFromTheLog: `torpor check` enumerates the sandboxes of the log, not
// of a view, and judges stays against the server's deadline (GET
// /v1/server: 10s here), not a default of its own. A sandbox whose view is
// gone, that stayed 30s in provisioning (appended as is, on a node no
// runner drives), is found and reported.
func checkFromTheLog(t *testing.T, a *app, srv string) {
	t.Helper()
	ctx := context.Background()
	id := uuid.Must(uuid.NewV7()).String()
	now := time.Now()
	created, _ := events.NewEnvelope(id, &events.Created{Name: "unviewed", Driver: "sim", Node: "elsewhere", Generation: 1}, events.Meta{CommandID: "c1"}, now.Add(-30*time.Second))
	attached, _ := events.NewEnvelope(id, &events.SupervisorAttached{Generation: 1}, events.Meta{}, now)
	created.Phase, attached.Phase = events.PhaseProvisioning, events.PhaseReady
	if _, err := a.Store().Append(ctx, id, 0, created, attached); err != nil {
		t.Fatal(err)
	}
	c := appClient(a)
	if _, err := c.Wait(ctx, id, events.PhaseReady, 10*time.Second); err != nil {
		t.Fatalf("the view never showed %s ready: %v", id, err)
	}
	js, _ := jetstream.New(a.Conn())
	kv, err := js.KeyValue(ctx, "torpor_phases")
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	p, err := c.List(ctx, "", "", 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range p.Items {
		if v.ID == id {
			t.Fatalf("list still shows %s", id)
		}
	}
	code, out, _ := cli(t, srv, "check", "-o", "json")
	var vs []check.Violation
	if code == 0 || json.Unmarshal([]byte(out), &vs) != nil {
		t.Fatalf("check -o json: exit %d\n%s", code, out)
	}
	for _, v := range vs {
		if v.SandboxID == id && v.Rule == check.RuleStay && v.Seq != 0 {
			return
		}
	}
	t.Fatalf("check -o json: %v; want the 30s stay of %s in provisioning past the server's 10s deadline", vs, id)
}

// TestFlagsRefusedWithContractCode: a verb that refuses the flags it was
// given (after cobra took them) says INVALID_ARGUMENT and names the flag,
// as cobra's own refusals do, rather than INTERNAL; nothing runs.
func TestFlagsRefusedWithContractCode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--data", t.TempDir(), "--duplicate-window", "0"}, "--duplicate-window"},
		{[]string{"serve", "--data", t.TempDir(), "--heartbeat-limit", "0"}, "--heartbeat-limit"},
		{[]string{"serve", "--data", t.TempDir(), "--retain-for", "-1s"}, "--retain-for"},
		{[]string{"serve", "--data", t.TempDir(), "--idle-after", "-1s"}, "--idle-after"},
		{[]string{"serve", "--data", t.TempDir(), "--idle-after", "10s"}, "more than the activity window"},
		{[]string{"serve", "--data", t.TempDir(), "--idle-after", "5m", "--idle-action", "delete"}, "--idle-action"},
		{[]string{"serve", "--data", t.TempDir(), "--idle-fallback", "stop"}, "--idle-after too"},
		{[]string{"serve", "--data", t.TempDir(), "--node", "Bad.Node"}, "--node"},
		{[]string{"serve", "--data", t.TempDir(), "--replicas", "6"}, "--replicas 6"},
		{[]string{"serve", "--data", t.TempDir(), "--replicas", "-1"}, "--replicas -1"},
		{[]string{"serve", "--data", t.TempDir(), "--replicas", "3"}, "embedded NATS server is one server"},
		{[]string{"serve", "--data", t.TempDir(), "--raise-replicas"}, "--raise-replicas"},
		{[]string{"bench", "--sandboxes", "4", "--concurrency", "8"}, "--concurrency"},
		{[]string{"check", "--slack", "-1s"}, "--slack"},
		{[]string{"supervise", "--generation", "1", "--nats-url", "nats://127.0.0.1:1", "--", "true"}, "no sandbox"},
		{[]string{"supervise", "--sandbox", "s1", "--generation", "0", "--nats-url", "nats://127.0.0.1:1", "--", "true"}, "generation 0"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errb)
		if code != exitStatus(events.CodeInvalidArgument) || !strings.HasPrefix(errb.String(), "torpor: INVALID_ARGUMENT: ") || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want INVALID_ARGUMENT naming %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
