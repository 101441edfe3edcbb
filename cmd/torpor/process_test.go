package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
	"github.com/torpor/torpor/services/node/servetest"
)

// processApp is the service as serve wires it, its process driver's
// supervisors running the built torpor and heartbeating three times within
// limit.
func processApp(t *testing.T, limit time.Duration, mods ...func(*serveConfig)) (*app, *torpor.Client, string) {
	t.Helper()
	dir := t.TempDir()
	bin := binary(t)
	t.Cleanup(func() { deleteProcessSandboxes(t, dir) })
	a := startApp(t, dir, func(c *serveConfig) {
		c.Torpor, c.HeartbeatLimit = bin, limit
		for _, m := range mods {
			m(c)
		}
	})
	return a, appClient(a), dir
}

// refusing is the real process driver, but for the suspensions it is told
// to refuse: what a driver that cannot freeze a group just now answers.
type refusing struct {
	*process.Driver
	refuse atomic.Bool
}

func (r *refusing) Suspend(ctx context.Context, t compute.Target) (string, error) {
	if r.refuse.Load() {
		return "", fmt.Errorf("suspend %s: %w: told to refuse", t.Spec.SandboxID, compute.ErrRejected)
	}
	return r.Driver.Suspend(ctx, t)
}

// counting is a workload that writes "<its pid> <count>" to ./counter
// twenty times a second.
var counting = []string{"sh", "-c", `i=0; while true; do i=$((i+1)); echo "$$ $i" > counter.new; mv counter.new counter; sleep 0.05; done`}

// lifecycleTo sends verb to id and waits for phase want after it.
func lifecycleTo(t *testing.T, c *torpor.Client, verb, id string, want events.Phase) events.View {
	t.Helper()
	acc, err := c.Lifecycle(context.Background(), verb, id, false, "")
	if err != nil {
		t.Fatalf("%s %s: %v", verb, id, err)
	}
	v, err := c.WaitAfter(context.Background(), id, want, acc.Seq, waitFor)
	if err != nil {
		t.Fatalf("%s %s: wait for %s: %v (%+v)", verb, id, want, err, v)
	}
	return v
}

// TestProcessSandboxesAreApartAndFenced: two counting process sandboxes;
// suspending one freezes it (its count stands) while the other counts on,
// and it stays suspended well past the heartbeat limit; resumed under
// generation 2 the same process counts on, the other untouched, and it stays
// ready past the limit again, its supervisor heartbeating as generation 2.
// Then the supervisor's own first credential (generation 1's, read from its
// environment) is fenced: its exit, heartbeat and attach are refused with
// FAILED_PRECONDITION, and the same credential claiming generation 2 with
// UNAUTHENTICATED; nothing of them is recorded, and each is counted.
func TestProcessSandboxesAreApartAndFenced(t *testing.T) {
	const limit = 900 * time.Millisecond
	a, c, dir := processApp(t, limit)
	ctx := context.Background()
	counter := func(id string) string { return filepath.Join(dir, "process", id, "work", "counter") }
	var ids [2]string
	for i := range ids {
		v, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: counting}, "")
		if err != nil {
			t.Fatal(err)
		}
		mustWait(t, c, v.ID, events.PhaseReady)
		ids[i] = v.ID
	}
	frozen, other := ids[0], ids[1]
	pid, _ := readCounter(t, counter(frozen), 1)
	otherPid, _ := readCounter(t, counter(other), 1)

	if v := lifecycleTo(t, c, "suspend", frozen, events.PhaseSuspended); !v.Restore.Held {
		t.Fatalf("suspended: %+v", v)
	}
	_, stood := readCounter(t, counter(frozen), 0)
	_, n := readCounter(t, counter(other), 0)
	// Frozen for 2 s (past twice the heartbeat limit), while the other
	// counts on.
	until := time.Now().Add(max(2*time.Second, 2*limit))
	for time.Now().Before(until) {
		_, n = readCounter(t, counter(other), n+1)
	}
	if _, now := readCounter(t, counter(frozen), 0); now != stood {
		t.Fatalf("suspended, the counter went on from %d to %d", stood, now)
	}
	if v, _ := c.Get(ctx, frozen); v.Phase != events.PhaseSuspended || !v.Restore.Held {
		t.Fatalf("past the heartbeat limit while suspended: %+v", v)
	}

	if v := lifecycleTo(t, c, "resume", frozen, events.PhaseReady); v.Generation != 2 || v.LastOutcome != events.OutcomeRestored {
		t.Fatalf("resumed: %+v", v)
	}
	if p, _ := readCounter(t, counter(frozen), stood+1); p != pid {
		t.Fatalf("resumed, the counter is written by %d, not %d", p, pid)
	}
	if p, _ := readCounter(t, counter(other), n+1); p != otherPid {
		t.Fatalf("the other sandbox's counter is written by %d, not %d", p, otherPid)
	}
	// Generation 2's heartbeats are taken: past the limit it is ready still.
	time.Sleep(2 * limit)
	if v, _ := c.Get(ctx, frozen); v.Phase != events.PhaseReady || v.Generation != 2 {
		t.Fatalf("past the heartbeat limit after the resume: %+v", v)
	}

	// The supervisor started as generation 1 and keeps that credential in
	// its environment: a report of generation 1 is fenced.
	st, err := os.ReadFile(filepath.Join(dir, "process", frozen, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var state struct {
		Supervisor struct{ Pid int } `json:"supervisor"`
	}
	if err := json.Unmarshal(st, &state); err != nil || state.Supervisor.Pid == 0 {
		t.Fatalf("state.json: %v %s", err, st)
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", state.Supervisor.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var cred1 string
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if v, ok := strings.CutPrefix(string(kv), process.CredentialEnv+"="); ok {
			cred1 = v
		}
	}
	if cred1 == "" {
		t.Fatalf("no %s in the supervisor's environment", process.CredentialEnv)
	}
	before, refused := history(t, c, frozen), a.Service().ReportsRefused()
	nc := busConn(t, a)
	for _, tc := range []struct {
		name string
		r    compute.Report
		code events.Code
	}{
		{"generation 1's exit", compute.Report{Generation: 1, Credential: cred1, Kind: compute.ReportExited, ExitCode: 9}, events.CodeFailedPrecondition},
		{"generation 1's heartbeat", compute.Report{Generation: 1, Credential: cred1, Kind: compute.ReportHeartbeat}, events.CodeFailedPrecondition},
		{"generation 1's attach", compute.Report{Generation: 1, Credential: cred1, Kind: compute.ReportAttached}, events.CodeFailedPrecondition},
		{"generation 1's credential as generation 2", compute.Report{Generation: 2, Credential: cred1, Kind: compute.ReportExited, ExitCode: 9}, events.CodeUnauthenticated},
	} {
		tc.r.SandboxID = frozen
		if code := sendReport(t, nc, tc.r); code != tc.code {
			t.Errorf("%s: %q, want %s", tc.name, code, tc.code)
		}
	}
	if after := history(t, c, frozen); len(after) != len(before) {
		t.Fatalf("fenced reports were recorded: %+v", after[len(before):])
	}
	if n := a.Service().ReportsRefused() - refused; n < 4 {
		t.Fatalf("%d refused reports counted, want the 4 sent at least", n)
	}
	if v, _ := c.Get(ctx, frozen); v.Phase != events.PhaseReady || v.ExitCode != nil {
		t.Fatalf("after the fenced reports: %+v", v)
	}
	if p, _ := readCounter(t, counter(frozen), 0); p != pid {
		t.Fatalf("after the fenced reports the counter is written by %d", p)
	}
}

// history is the event types of id's history, oldest first.
func history(t *testing.T, c *torpor.Client, id string) []string {
	t.Helper()
	h, err := c.History(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(h))
	for i, e := range h {
		out[i] = e.Type
	}
	return out
}

// TestProcessForwardCarriesHTTP: a process sandbox serving HTTP with
// busybox httpd; a forward to its port carries requests; a suspension the
// driver rejects leaves the sandbox ready, its workload the same process,
// and the forward carrying; while it is suspended a request waits, and is answered once it is resumed; after the
// resume the forward carries on. A forward to a port nothing listens on is
// refused with FAILED_PRECONDITION.
func TestProcessForwardCarriesHTTP(t *testing.T) {
	busybox := servetest.Need(t, "busybox")
	var drv *refusing
	a, c, dir := processApp(t, 15*time.Second, func(cfg *serveConfig) {
		cfg.WrapDrivers = func(r compute.Registry) {
			drv = &refusing{Driver: r["process"].(*process.Driver)}
			r["process"] = drv
		}
	})
	ctx := context.Background()
	port := freePort(t)
	v, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sh", "-c",
		fmt.Sprintf(`echo served from a sandbox > index.html; exec %s httpd -f -p 127.0.0.1:%d -h .`, busybox, port)}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	// httpd listens a moment after it runs: the sandbox is ready first.
	var fw events.Forward
	eventually(t, "httpd listening", func() bool {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	fw = openForward(t, a, v.ID, port)
	const want = "served from a sandbox\n"
	if got, err := through(t, fw.Address); err != nil || got != want {
		t.Fatalf("through the forward: %q, %v", got, err)
	}

	pidOf := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "process", v.ID, "run.json"))
		return string(b)
	}
	before := pidOf()
	drv.refuse.Store(true)
	if got := lifecycleTo(t, c, "suspend", v.ID, events.PhaseReady); got.LastOutcome != events.OutcomeSuspendRejected || got.Generation != 1 {
		t.Fatalf("the rejected suspension: %+v", got)
	}
	drv.refuse.Store(false)
	if got, err := through(t, fw.Address); err != nil || got != want {
		t.Fatalf("through the forward after the rejected suspension: %q, %v", got, err)
	}
	if after := pidOf(); after != before {
		t.Fatalf("the rejected suspension changed the workload: %s, then %s", before, after)
	}

	lifecycleTo(t, c, "suspend", v.ID, events.PhaseSuspended)
	held := throughLater(t, fw.Address)
	select {
	case got := <-held:
		t.Fatalf("a frozen httpd answered: %q", got)
	case <-time.After(300 * time.Millisecond):
	}
	lifecycleTo(t, c, "resume", v.ID, events.PhaseReady)
	if got := <-held; got != want {
		t.Fatalf("the request held across the resume: %q", got)
	}
	if got, err := through(t, fw.Address); err != nil || got != want {
		t.Fatalf("through the forward after the resume: %q, %v", got, err)
	}

	closed := freePort(t)
	resp, err := http.Post("http://"+a.HTTPAddr()+"/v1/sandboxes/"+v.ID+"/forwards", "application/json",
		strings.NewReader(fmt.Sprintf(`{"listen":"127.0.0.1:0","port":%d}`, closed)))
	if err != nil {
		t.Fatal(err)
	}
	eb := decodeJSON[events.ErrorBody](t, resp.Body)
	resp.Body.Close()
	if eb.Error == nil || eb.Error.Code != events.CodeFailedPrecondition {
		t.Fatalf("a forward to a closed port: %d %+v, want FAILED_PRECONDITION", resp.StatusCode, eb.Error)
	}
	if got, _ := c.Get(ctx, v.ID); len(got.Forwards) != 1 {
		t.Fatalf("forwards in the view: %+v, want the one opened", got.Forwards)
	}
}

// TestProcessBadInput: what each bad process create gets. A create the
// driver can tell is wrong (no command, an option, an environment or an
// argument exec cannot take) is refused with
// INVALID_ARGUMENT and nothing is recorded; a command the node does not
// have is accepted and its start fails: error, reason StartFailed, with the
// driver's message; a workload that exits gets error with its exit code.
func TestProcessBadInput(t *testing.T) {
	_, c, _ := processApp(t, 15*time.Second)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		r    torpor.CreateRequest
	}{
		{"no command", torpor.CreateRequest{Driver: "process"}},
		{"an empty command", torpor.CreateRequest{Driver: "process", Command: []string{""}}},
		{"an option", torpor.CreateRequest{Driver: "process", Command: counting, DriverOptions: map[string]string{"suspend": "reject"}}},
		{"an empty env name", torpor.CreateRequest{Driver: "process", Command: counting, Env: map[string]string{"": "x"}}},
		{"an env name with '='", torpor.CreateRequest{Driver: "process", Command: counting, Env: map[string]string{"A=B": "x"}}},
		{"a NUL in an env value", torpor.CreateRequest{Driver: "process", Command: counting, Env: map[string]string{"A": "x\x00y"}}},
		{"a NUL in an argument", torpor.CreateRequest{Driver: "process", Command: []string{"sh", "-c", "true\x00"}}},
	} {
		_, err := c.Create(ctx, tc.r, "")
		if code := events.CodeOf(err); code != events.CodeInvalidArgument {
			t.Errorf("%s: %v (%s), want INVALID_ARGUMENT", tc.name, err, code)
		}
	}
	if page, err := c.List(ctx, "", "", 100, ""); err != nil || len(page.Items) != 0 {
		t.Fatalf("refused creates left sandboxes: %+v, %v", page.Items, err)
	}

	v, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"torpor-no-such-command"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := mustWait(t, c, v.ID, events.PhaseError); got.Reason != events.ReasonStartFailed {
		t.Fatalf("a command not on the node: %+v", got)
	}
	h, err := c.History(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if last := h[len(h)-1]; last.Type != events.TypeStartFailed || !strings.Contains(string(last.Data), "torpor-no-such-command") {
		t.Fatalf("the failed start's event: %s %s, want %s naming the command", last.Type, last.Data, events.TypeStartFailed)
	}
	v, err = c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sh", "-c", "exit 7"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := mustWait(t, c, v.ID, events.PhaseError); got.ExitCode == nil || *got.ExitCode != 7 || got.Reason != events.ReasonMainProcessExited {
		t.Fatalf("a workload that exits 7: %+v", got)
	}
}

// freePort is a TCP port nothing listens on just now.
func freePort(t *testing.T) int {
	t.Helper()
	return freePorts(t, 1)[0]
}

// freePorts returns n distinct free loopback ports: each is held until all
// are picked, as a port let go at once can be handed out again (a cluster
// of three servers was given one port twice).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// TestProcessFromTheCLI: `torpor create --driver process --env K=V
// -- CMD…` runs the command with the variable, and `torpor logs` shows its
// output; a second NAME, a variable without '=' and a process create with no
// command are refused with INVALID_ARGUMENT. Suspended, `resume --node`
// another node is refused with FAILED_PRECONDITION (a frozen group stays on
// its node, CONTRACT §9) and leaves it suspended; `--node` its own node
// resumes it.
func TestProcessFromTheCLI(t *testing.T) {
	a, c, _ := processApp(t, 15*time.Second)
	server := "http://" + a.HTTPAddr()
	code, out, errs := cli(t, server, "-o", "json", "create", "greeter", "--driver", "process", "--env", "GREETING=hello, there",
		"--", "sh", "-c", `echo "$GREETING"; exec sleep 1000`)
	if code != 0 {
		t.Fatalf("create: %d %s", code, errs)
	}
	var v events.View
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Phase != events.PhaseReady || v.Driver != "process" {
		t.Fatalf("create printed %q (%v)", out, err)
	}
	eventually(t, "the greeting in the logs", func() bool {
		code, out, _ := cli(t, server, "logs", "greeter")
		return code == 0 && out == "hello, there\n"
	})
	for _, args := range [][]string{
		{"create", "one", "two", "--", "true"},
		{"create", "--driver", "process", "--env", "NOVALUE", "--", "true"},
		{"create", "--driver", "process", "--no-wait"},
	} {
		if code, _, errs := cli(t, server, args...); code != 2 || !strings.HasPrefix(errs, "torpor: INVALID_ARGUMENT: ") {
			t.Errorf("%v: exit %d, %q; want INVALID_ARGUMENT", args, code, errs)
		}
	}
	if page, err := c.List(context.Background(), "", "", 100, ""); err != nil || len(page.Items) != 1 {
		t.Fatalf("sandboxes after the refused creates: %+v, %v", page.Items, err)
	}

	if code, _, errs := cli(t, server, "suspend", "greeter"); code != 0 {
		t.Fatalf("suspend: %d %s", code, errs)
	}
	if code, _, errs := cli(t, server, "resume", "greeter", "--node", "elsewhere"); code != 4 || !strings.HasPrefix(errs, "torpor: FAILED_PRECONDITION: ") {
		t.Fatalf("resume on another node: exit %d, %q; want FAILED_PRECONDITION", code, errs)
	}
	if got, _ := c.Get(context.Background(), v.ID); got.Phase != events.PhaseSuspended || !got.Restore.Held {
		t.Fatalf("after the refused resume: %+v", got)
	}
	code, out, errs = cli(t, server, "-o", "json", "resume", "greeter", "--node", "local")
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Phase != events.PhaseReady || v.Generation != 2 {
		t.Fatalf("resume on its own node: %d %s %s", code, out, errs)
	}
}
