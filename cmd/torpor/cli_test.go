package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/torpor/torpor/events"
)

// cli runs the torpor binary's entry point against a server.
func cli(t *testing.T, server string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"--server", server}, args...), &out, &errb)
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
