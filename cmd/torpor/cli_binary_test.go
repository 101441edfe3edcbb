package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// cliEnv is the test's environment without the variables the CLI reads, so
// that each run sets its own.
func cliEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "TORPOR_SERVER=") || strings.HasPrefix(kv, "TORPOR_LIFECYCLE_TIMEOUT=") || strings.HasPrefix(kv, "TORPOR_TOKEN=")
	})
}

// torporRun runs the torpor binary with --server srv (none when srv is "")
// and args, with env added and no terminal, and returns its exit status,
// stdout and stderr.
func torporRun(t *testing.T, srv string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if srv != "" {
		args = append([]string{"--server", srv}, args...)
	}
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(append(cliEnv(), tokenEnv(srv)...), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), out.String(), errb.String()
	case err != nil:
		t.Fatalf("torpor %v: %v\n%s%s", args, err, out.String(), errb.String())
	}
	return 0, out.String(), errb.String()
}

// TestCLIBinary runs the real binary against one real server for every
// client verb and output format, the failures and their exit statuses, the
// waits, the confirmation of a start that discards retained state, watch
// and completion.
func TestCLIBinary(t *testing.T) {
	a := startApp(t, "", nil)
	srv := "http://" + a.HTTPAddr()
	c := appClient(a)
	ctx := context.Background()
	tb := func(t *testing.T, env []string, args ...string) (int, string, string) {
		t.Helper()
		return torporRun(t, srv, env, args...)
	}
	ok := func(t *testing.T, args ...string) (string, string) {
		t.Helper()
		code, out, stderr := tb(t, nil, args...)
		if code != 0 {
			t.Fatalf("torpor %v: exit %d\n%s%s", args, code, out, stderr)
		}
		return out, stderr
	}
	fails := func(t *testing.T, env []string, code events.Code, args ...string) string {
		t.Helper()
		got, out, stderr := tb(t, env, args...)
		if got != exitStatuses[code] || !strings.Contains(stderr, "torpor: "+string(code)+": ") {
			t.Fatalf("torpor %v: exit %d, stderr %q; want %d and %s\n%s", args, got, stderr, exitStatuses[code], code, out)
		}
		return stderr
	}
	view := func(t *testing.T, out string) events.View {
		t.Helper()
		var v events.View
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("not a view: %v\n%s", err, out)
		}
		return v
	}
	phase := func(t *testing.T, ref string) events.View {
		t.Helper()
		v, err := c.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	t.Run("create and get in every format", func(t *testing.T) {
		out, stderr := ok(t, "create", "fmt-a", "--label", "team=a", "--label", "tier=web")
		if !regexp.MustCompile(`(?m)^NAME\s+ID\s+PHASE\s+GEN\s+OUTCOME\s+AGE\s*$`).MatchString(out) || !regexp.MustCompile(`(?m)^fmt-a\s+\S+\s+ready\s+1\s`).MatchString(out) {
			t.Fatalf("create -o table:\n%s", out)
		}
		if !regexp.MustCompile(`creating fmt-a … ready in \S+`).MatchString(stderr) {
			t.Fatalf("create's progress on stderr: %q", stderr)
		}
		if out, _ := ok(t, "create", "fmt-b", "--label", "team=a", "-o", "name"); out != "fmt-b\n" {
			t.Fatalf("create -o name: %q", out)
		}
		if v := view(t, first(ok(t, "create", "fmt-c", "--label", "team=b", "-o", "json"))); v.Phase != events.PhaseReady || v.Name != "fmt-c" {
			t.Fatalf("create -o json: %+v", v)
		}
		out, _ = ok(t, "get", "fmt-a", "-o", "wide")
		if !regexp.MustCompile(`(?m)^NAME\s+ID\s+PHASE\s+GEN\s+OUTCOME\s+AGE\s+DRIVER\s+NODE\s+LABELS\s+RESTORE\s+REASON\s+SEQ\s*$`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^fmt-a\s+\S+\s+ready\s+1\s+-\s+\S+\s+sim\s+local\s+team=a,tier=web\s+-\s+-\s+\d+\s*$`).MatchString(out) {
			t.Fatalf("get -o wide:\n%s", out)
		}
		id := phase(t, "fmt-a").ID
		if v := view(t, first(ok(t, "get", id, "-o", "json"))); v.Name != "fmt-a" {
			t.Fatalf("get by id: %+v", v)
		}
		if out, _ := ok(t, "get", id, "-o", "name"); out != "fmt-a\n" {
			t.Fatalf("get -o name: %q", out)
		}
	})

	t.Run("list filters on every label given", func(t *testing.T) {
		if out, _ := ok(t, "list", "-l", "team=a", "-o", "name"); out != "fmt-a\nfmt-b\n" {
			t.Fatalf("list -l team=a: %q", out)
		}
		if out, _ := ok(t, "list", "-l", "team=a", "-l", "tier=web", "-o", "name"); out != "fmt-a\n" {
			t.Fatalf("list -l team=a -l tier=web: %q", out)
		}
		if out, _ := ok(t, "list", "-l", "tier=web", "--label", "team=b", "-o", "name"); out != "" {
			t.Fatalf("list with labels no sandbox has together: %q", out)
		}
		out, _ := ok(t, "list", "-l", "team=a", "-o", "json")
		var p torpor.Page
		if err := json.Unmarshal([]byte(out), &p); err != nil || len(p.Items) != 2 {
			t.Fatalf("list -o json: %v\n%s", err, out)
		}
		out, _ = ok(t, "list", "-l", "team=a", "-o", "wide")
		if !strings.Contains(out, "LABELS") || strings.Count(out, "\n") != 3 {
			t.Fatalf("list -o wide:\n%s", out)
		}
		out, stderr := ok(t, "list", "-l", "team=a", "--limit", "1", "-o", "name")
		if out != "fmt-a\n" || !strings.Contains(stderr, "--cursor") {
			t.Fatalf("list --limit 1 -o name: %q %q", out, stderr)
		}
		fails(t, nil, events.CodeInvalidArgument, "list", "-l", "team")
	})

	t.Run("list sorts and filters by name, driver and node", func(t *testing.T) {
		if out, _ := ok(t, "list", "--name", "FMT-", "--sort", "-name", "-o", "name"); out != "fmt-c\nfmt-b\nfmt-a\n" {
			t.Fatalf("list --name FMT- --sort -name: %q", out)
		}
		if out, _ := ok(t, "list", "--name", "fmt", "--driver", "sim", "--node", "local", "-l", "team=a", "--sort", "name", "-o", "name"); out != "fmt-a\nfmt-b\n" {
			t.Fatalf("list --name fmt --driver sim --node local -l team=a --sort name: %q", out)
		}
		if out, _ := ok(t, "list", "--name", "fmt", "--driver", "process", "-o", "name"); out != "" {
			t.Fatalf("list --driver process: %q", out)
		}
		out, _ := ok(t, "list", "--name", "fmt", "--sort", "name", "--limit", "1", "-o", "json")
		var p torpor.Page
		if err := json.Unmarshal([]byte(out), &p); err != nil || len(p.Items) != 1 || p.Items[0].Name != "fmt-a" || p.Total != 3 || p.Next == "" {
			t.Fatalf("list --sort name --limit 1 -o json: %v\n%s", err, out)
		}
		if out, _ := ok(t, "list", "--name", "fmt", "--sort", "name", "--limit", "1", "--cursor", p.Next, "-o", "name"); out != "fmt-b\n" {
			t.Fatalf("list --sort name at the cursor of its first page: %q", out)
		}
		fails(t, nil, events.CodeInvalidArgument, "list", "--sort", "age", "--cursor", p.Next)
		fails(t, nil, events.CodeInvalidArgument, "list", "--sort", "size")
	})

	t.Run("lifecycle verbs wait and print", func(t *testing.T) {
		ok(t, "create", "life")
		out, stderr := ok(t, "suspend", "life", "-o", "json")
		if v := view(t, out); v.Phase != events.PhaseSuspended || !v.Restore.Held {
			t.Fatalf("suspend: %+v", v)
		}
		if !regexp.MustCompile(`suspending life … suspended in \S+\n$`).MatchString(stderr) {
			t.Fatalf("suspend's progress: %q", stderr)
		}
		if out, _ := ok(t, "resume", "life", "-o", "name"); out != "life\n" {
			t.Fatalf("resume -o name: %q", out)
		}
		if v := phase(t, "life"); v.Phase != events.PhaseReady || v.LastOutcome != "restored" {
			t.Fatalf("after resume: %+v", v)
		}
		out, _ = ok(t, "stop", "life", "-o", "wide")
		if !regexp.MustCompile(`(?m)^life\s+\S+\s+stopped\s`).MatchString(out) {
			t.Fatalf("stop -o wide:\n%s", out)
		}
		if out, _ := ok(t, "start", "life", "-o", "name"); out != "life\n" {
			t.Fatalf("start: %q", out)
		}
		// Idempotent: already ready, nothing to wait for.
		if v := view(t, first(ok(t, "start", "life", "-o", "json"))); v.Phase != events.PhaseReady || v.Generation != 3 {
			t.Fatalf("start of a ready sandbox: %+v", v)
		}
		out, stderr = ok(t, "history", "life", "-o", "name")
		if !strings.Contains(out, "sandbox.retained_state_consumed\n") || stderr != "" {
			t.Fatalf("history -o name: %q", out)
		}
		var h []torpor.Event
		if out, _ := ok(t, "history", "life", "-o", "json"); json.Unmarshal([]byte(out), &h) != nil || len(h) == 0 {
			t.Fatalf("history -o json: %s", out)
		}
		if out, _ := ok(t, "history", "life"); !strings.HasPrefix(out, "SEQ") {
			t.Fatalf("history: %s", out)
		}
		id := phase(t, "life").ID
		if v := view(t, first(ok(t, "delete", id, "-o", "json"))); v.Phase != events.PhaseDeleted {
			t.Fatalf("delete by id: %+v", v)
		}
	})

	t.Run("wrong phase, unknown sandbox, bad input", func(t *testing.T) {
		ok(t, "create", "wrong")
		if msg := fails(t, nil, events.CodeFailedPrecondition, "resume", "wrong"); !strings.Contains(msg, "ready") {
			t.Fatalf("resume of a ready sandbox: %q", msg)
		}
		fails(t, nil, events.CodeNotFound, "get", "nobody")
		fails(t, nil, events.CodeNotFound, "suspend", "nobody")
		fails(t, nil, events.CodeNotFound, "suspend", "0193b0a4-0000-7000-8000-0000000000ff")
		fails(t, nil, events.CodeAlreadyExists, "create", "wrong")
		fails(t, nil, events.CodeInvalidArgument, "suspend", "wrong", "--bogus")
		fails(t, nil, events.CodeInvalidArgument, "suspend")
		fails(t, nil, events.CodeInvalidArgument, "get", "wrong", "-o", "yaml")
		fails(t, nil, events.CodeInvalidArgument, "suspend", "wrong", "--timeout", "-1s")
		fails(t, []string{"TORPOR_LIFECYCLE_TIMEOUT=soon"}, events.CodeInvalidArgument, "suspend", "wrong")
		if v := phase(t, "wrong"); v.Phase != events.PhaseReady {
			t.Fatalf("refused commands moved the sandbox: %+v", v)
		}
	})

	t.Run("a server that is down is named", func(t *testing.T) {
		for _, run := range []func() (int, string, string){
			func() (int, string, string) { return torporRun(t, "http://127.0.0.1:1", nil, "list") },
			func() (int, string, string) {
				return torporRun(t, "", []string{"TORPOR_SERVER=http://127.0.0.1:1"}, "suspend", "x")
			},
			func() (int, string, string) { return torporRun(t, "http://127.0.0.1:1", nil, "watch") },
		} {
			code, _, stderr := run()
			if code != exitStatuses[events.CodeUnavailable] || !strings.HasPrefix(stderr, "torpor: UNAVAILABLE: cannot reach the torpor server at http://127.0.0.1:1 (") ||
				!strings.Contains(stderr, "--server") || !strings.Contains(stderr, "TORPOR_SERVER") || !strings.HasSuffix(stderr, "connection refused\n") {
				t.Errorf("no server: exit %d, %q", code, stderr)
			}
		}
	})

	t.Run("--no-wait and --timeout", func(t *testing.T) {
		// Every driver call of this one takes 600ms.
		v := view(t, first(ok(t, "create", "slow", "--opt", "latency=600ms", "--no-wait", "-o", "json")))
		if v.Phase != events.PhaseProvisioning {
			t.Fatalf("create --no-wait: %+v", v)
		}
		ok(t, "wait", "slow", "--for", "ready")
		msg := fails(t, nil, events.CodeDeadlineExceeded, "suspend", "slow", "--timeout", "100ms")
		if !strings.Contains(msg, "suspend slow: not suspended after 100ms (it is suspending)") || !strings.Contains(msg, "--timeout") {
			t.Fatalf("suspend --timeout: %q", msg)
		}
		ok(t, "wait", "slow", "--for", "suspended")
		fails(t, []string{"TORPOR_LIFECYCLE_TIMEOUT=100ms"}, events.CodeDeadlineExceeded, "resume", "slow")
		ok(t, "wait", "slow", "--for", "ready")
		if _, stderr := ok(t, "stop", "slow"); !strings.Contains(stderr, "stopping slow … stopped in") {
			t.Fatalf("stop: %q", stderr)
		}
		if v := view(t, first(ok(t, "start", "slow", "--no-wait", "-o", "json"))); v.Phase != events.PhaseStarting {
			t.Fatalf("start --no-wait: %+v", v)
		}
		// --timeout wins over the environment.
		if code, out, stderr := tb(t, []string{"TORPOR_LIFECYCLE_TIMEOUT=1ms"}, "wait", "slow", "--for", "ready", "--timeout", "1m"); code != 0 {
			t.Fatalf("wait --timeout 1m with TORPOR_LIFECYCLE_TIMEOUT=1ms: exit %d %s%s", code, out, stderr)
		}
	})

	t.Run("a wait that settles elsewhere fails with the reason", func(t *testing.T) {
		ok(t, "create", "rejects", "--opt", "suspend=reject")
		msg := fails(t, nil, events.CodeFailedPrecondition, "suspend", "rejects")
		if !strings.Contains(msg, "suspend rejects: it ended ready, not suspended") || !strings.Contains(msg, "SuspendRejected") {
			t.Fatalf("rejected suspend: %q", msg)
		}
		ok(t, "create", "unrestorable", "--opt", "resume=fail")
		ok(t, "suspend", "unrestorable")
		msg = fails(t, nil, events.CodeFailedPrecondition, "resume", "unrestorable")
		if !strings.Contains(msg, "resume unrestorable: it ended suspended, not ready") || !strings.Contains(msg, "restore_failed") {
			t.Fatalf("failed resume: %q", msg)
		}
		if v := phase(t, "unrestorable"); v.Phase != events.PhaseSuspended || !v.Restore.Held {
			t.Fatalf("after the failed resume: %+v", v)
		}
	})

	t.Run("start of a suspended sandbox asks first", func(t *testing.T) {
		ok(t, "create", "frozen")
		ok(t, "suspend", "frozen")
		// No terminal, no --yes: refused, the retained state kept.
		msg := fails(t, nil, events.CodeFailedPrecondition, "start", "frozen")
		if !strings.Contains(msg, "--yes") || !strings.Contains(msg, "retained state") {
			t.Fatalf("start without a terminal: %q", msg)
		}
		if v := phase(t, "frozen"); v.Phase != events.PhaseSuspended || !v.Restore.Held {
			t.Fatalf("after the refused start: %+v", v)
		}
		// On a terminal, answered n: nothing happens.
		s := startPTY(t, "--server", srv, "start", "frozen")
		s.expect(`discards its retained state[^\n]*\n.*\[y/N\] $`)
		s.send("n\r")
		if code := s.exit(); code != exitStatuses[events.CodeFailedPrecondition] || !strings.Contains(s.screen(), "not confirmed") {
			t.Fatalf("start answered n: exit %d\n%s", code, s.screen())
		}
		if v := phase(t, "frozen"); v.Phase != events.PhaseSuspended || !v.Restore.Held || v.Generation != 1 {
			t.Fatalf("after start answered n: %+v", v)
		}
		// Answered y: it starts cold.
		s = startPTY(t, "--server", srv, "start", "frozen", "-o", "name")
		s.expect(`\[y/N\] $`)
		s.send("y\r")
		if code := s.exit(); code != 0 || !strings.Contains(s.screen(), "starting frozen") || !regexp.MustCompile(`frozen ready in \S+`).MatchString(s.screen()) {
			t.Fatalf("start answered y: exit %d, want 0 and the spinner's lines\n%s", code, s.screen())
		}
		v := phase(t, "frozen")
		if v.Phase != events.PhaseReady || v.Restore.Held || v.Generation != 2 {
			t.Fatalf("after start answered y: %+v", v)
		}
		if out, _ := ok(t, "history", "frozen", "-o", "name"); !strings.Contains(out, "sandbox.retained_state_discarded") || strings.Contains(out, "sandbox.resumed") {
			t.Fatalf("the start was not cold:\n%s", out)
		}
		// --yes, no terminal: it starts, with a warning.
		ok(t, "suspend", "frozen")
		out, stderr := ok(t, "start", "frozen", "--yes", "-o", "json")
		if v := view(t, out); v.Phase != events.PhaseReady || v.Restore.Held || v.Generation != 3 || !strings.Contains(stderr, "discards its retained state") {
			t.Fatalf("start --yes: %+v %q", v, stderr)
		}
	})

	t.Run("watch prints a JSON view per change", func(t *testing.T) {
		ok(t, "create", "watched", "--label", "w=1")
		ok(t, "create", "unwatched")
		from := phase(t, "watched")
		wctx, cancel := context.WithTimeout(ctx, waitFor)
		defer cancel()
		cmd := exec.CommandContext(wctx, binary(t), "--server", srv, "watch", "-o", "json", "-l", "w=1", "--after", fmt.Sprint(from.Seq))
		cmd.Env = append(cliEnv(), tokenEnv(srv)...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		ok(t, "suspend", "unwatched")
		ok(t, "suspend", "watched")
		ok(t, "resume", "watched")
		var seen []events.Phase
		for !slices.Contains(seen, events.PhaseSuspended) || seen[len(seen)-1] != events.PhaseReady {
			select {
			case l, open := <-lines:
				if !open {
					t.Fatalf("watch ended after %v: %s", seen, stderr.String())
				}
				var v events.View
				if err := json.Unmarshal([]byte(l), &v); err != nil || v.Name != "watched" || v.Seq <= from.Seq {
					t.Fatalf("watch -o json -l w=1 --after %d printed %q (%v)", from.Seq, l, err)
				}
				seen = append(seen, v.Phase)
			case <-wctx.Done():
				t.Fatalf("watch printed %v only", seen)
			}
		}
		// ^C ends it, with status 0.
		_ = cmd.Process.Signal(syscall.SIGINT)
		for range lines {
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("watch after SIGINT: %v %s", err, stderr.String())
		}

		// A table from the start, of one sandbox: a header, then its view.
		cmd = exec.CommandContext(wctx, binary(t), "--server", srv, "watch", "watched")
		cmd.Env = append(cliEnv(), tokenEnv(srv)...)
		stdout, _ = cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		var table []string
		for len(table) < 2 && sc.Scan() {
			table = append(table, sc.Text())
		}
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
		if len(table) != 2 || !regexp.MustCompile(`^SEQ\s+NAME\s+ID\s+PHASE\s+GEN\s+OUTCOME$`).MatchString(table[0]) ||
			!regexp.MustCompile(`^\d+\s+watched\s+\S{36}\s+ready\s+2\s+restored$`).MatchString(table[1]) ||
			strings.Index(table[0], "PHASE") != strings.Index(table[1], "ready") {
			t.Fatalf("watch watched:\n%s", strings.Join(table, "\n"))
		}
		fails(t, nil, events.CodeNotFound, "watch", "nobody")
	})

	t.Run("completion", func(t *testing.T) {
		env := append([]string{"TORPOR_SERVER=" + srv}, tokenEnv(srv)...)
		complete := func(args ...string) []string {
			t.Helper()
			code, out, stderr := torporRun(t, "", env, append([]string{"__complete"}, args...)...)
			if code != 0 {
				t.Fatalf("__complete %v: exit %d %s", args, code, stderr)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if lines[len(lines)-1] != ":4" { // ShellCompDirectiveNoFileComp
				t.Fatalf("__complete %v: directive %q", args, lines[len(lines)-1])
			}
			var names []string
			for _, l := range lines[:len(lines)-1] {
				name, _, _ := strings.Cut(l, "\t")
				names = append(names, name)
			}
			return names
		}
		// suspend completes the ready ones; resume the suspended ones.
		if got := complete("suspend", ""); !slices.Contains(got, "fmt-a") || slices.Contains(got, "unrestorable") || slices.Contains(got, "life") {
			t.Fatalf("suspend completes %v", got)
		}
		if got := complete("resume", ""); !slices.Contains(got, "unrestorable") || slices.Contains(got, "fmt-a") {
			t.Fatalf("resume completes %v", got)
		}
		if got := complete("get", "fmt-"); !slices.Equal(got, []string{"fmt-a", "fmt-b", "fmt-c"}) {
			t.Fatalf("get fmt- completes %v", got)
		}
		if got := complete("get", "fmt-a", ""); len(got) != 0 {
			t.Fatalf("get's second argument completes %v", got)
		}
		for shell, want := range map[string]string{"bash": "__start_torpor", "zsh": "#compdef torpor", "fish": "complete -c torpor"} {
			if out, _ := ok(t, "completion", shell); !strings.Contains(out, want) {
				t.Errorf("completion %s does not hold %q", shell, want)
			}
		}
	})
}

// first is the first of two strings (the stdout of ok).
func first(a, _ string) string { return a }

// TestExitStatusTable: the exit statuses of `torpor --help` and of the
// README's table are exitStatuses, every code of the contract has one, and
// run returns them.
func TestExitStatusTable(t *testing.T) {
	codes := []events.Code{events.CodeInvalidArgument, events.CodeUnauthenticated, events.CodePermissionDenied, events.CodeNotFound,
		events.CodeFailedPrecondition, events.CodeAborted, events.CodeResourceExhausted, events.CodeAlreadyExists,
		events.CodeUnimplemented, events.CodeUnavailable, events.CodeDeadlineExceeded, events.CodeInternal}
	seen := map[int]bool{}
	for _, c := range codes {
		s, ok := exitStatuses[c]
		if !ok || s == 0 {
			t.Errorf("%s has no exit status", c)
		}
		seen[s] = true
	}
	if len(exitStatuses) != len(codes) {
		t.Errorf("exitStatuses has %d codes, the contract %d", len(exitStatuses), len(codes))
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var help bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &help, &help); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, r := range exitRows() {
		// README: | 4 | `FAILED_PRECONDITION` … |
		row := fmt.Sprintf("| %d | ", r.status)
		for _, c := range r.codes {
			if c == strings.ToUpper(c) {
				c = "`" + c + "`"
			}
			row += c + ", "
		}
		row = strings.TrimSuffix(row, ", ") + " |"
		if !strings.Contains(string(readme), row) {
			t.Errorf("README.md has no row %q", row)
		}
		line := fmt.Sprintf("  %2d  %s\n", r.status, strings.Join(r.codes, ", "))
		if !strings.Contains(help.String(), line) {
			t.Errorf("torpor --help has no line %q:\n%s", line, help.String())
		}
	}
	// run's status is the table's (written out here: the README promises them).
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--server", "http://127.0.0.1:1", "get", "x"}, &out, &errb); code != 7 || exitStatuses[events.CodeUnavailable] != 7 {
		t.Errorf("get from no server: exit %d, want 7", code)
	}
	if code := run(context.Background(), []string{"get", "--bogus"}, &out, &errb); code != 2 || exitStatuses[events.CodeInvalidArgument] != 2 {
		t.Errorf("a bad flag: exit %d, want 2", code)
	}
}

var _ = time.Second
