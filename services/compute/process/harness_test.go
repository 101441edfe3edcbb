package process_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
)

// wait bounds every wait of these tests.
const wait = 20 * time.Second

// torporBin is the torpor binary the supervisors run: the tests run in the
// test binary, which has no `supervise` verb.
var torporBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "torpor-process-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	torporBin = filepath.Join(dir, "torpor")
	if out, err := exec.Command("go", "build", "-o", torporBin, "github.com/torpor/torpor/cmd/torpor").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cred is the credential the tests mint for generation gen (as drivertest does).
func cred(gen int64) string { return fmt.Sprintf("credential-of-%d", gen) }

// gateway answers supervisor reports on torpor.supervisor.* of a real
// nats-server as the gateway does: a report with a wrong credential is
// refused (UNAUTHENTICATED), one of an older generation than the newest
// attached is fenced (FAILED_PRECONDITION); a report taken goes to its
// sandbox's channel, and to all.
type gateway struct {
	url    string
	all    chan compute.Report
	nc     *nats.Conn
	handle nats.MsgHandler

	mu     sync.Mutex
	boxes  map[string]chan compute.Report
	newest map[string]int64
	// received is every report each sandbox's supervisors sent, taken or not.
	received map[string][]compute.Report
	sub      *nats.Subscription // nil while down
}

func newGateway(t testing.TB) *gateway {
	t.Helper()
	srv := natstest.StartWith(t, natstest.Options{Listen: true})
	g := &gateway{url: srv.ClientURL(), all: make(chan compute.Report, 4096), boxes: map[string]chan compute.Report{}, newest: map[string]int64{}, received: map[string][]compute.Report{}}
	g.nc = srv.Conn
	g.handle = func(m *nats.Msg) {
		var r compute.Report
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("a report that is no JSON: %q", m.Data)
			return
		}
		body, _ := json.Marshal(g.take(r))
		_ = m.Respond(body)
	}
	g.up(t)
	t.Cleanup(g.down)
	return g
}

// up starts answering reports (again).
func (g *gateway) up(t testing.TB) {
	t.Helper()
	sub, err := g.nc.Subscribe(compute.ReportSubject("*"), g.handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.sub = sub
	g.mu.Unlock()
}

// down stops answering reports, as a service that is down does not.
func (g *gateway) down() {
	g.mu.Lock()
	sub := g.sub
	g.sub = nil
	g.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
		_ = g.nc.Flush()
	}
}

// take judges r as the gateway would and returns the answer's body.
func (g *gateway) take(r compute.Report) any {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.received[r.SandboxID] = append(g.received[r.SandboxID], r)
	switch {
	case r.Credential != cred(r.Generation):
		return events.ErrorBody{Error: events.Errorf(events.CodeUnauthenticated, "bad credential")}
	case r.Generation < g.newest[r.SandboxID]:
		return events.ErrorBody{Error: events.Errorf(events.CodeFailedPrecondition, "generation %d is fenced", r.Generation)}
	}
	if r.Kind == compute.ReportAttached {
		g.newest[r.SandboxID] = r.Generation
	}
	g.box(r.SandboxID) <- r
	select {
	case g.all <- r:
	default: // a test that does not read all
	}
	return map[string]bool{"ok": true}
}

// sent is every report sandbox id's supervisors sent so far, taken or not.
func (g *gateway) sent(id string) []compute.Report {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]compute.Report(nil), g.received[id]...)
}

// box is sandbox id's channel of reports taken; g.mu is held.
func (g *gateway) box(id string) chan compute.Report {
	ch := g.boxes[id]
	if ch == nil {
		ch = make(chan compute.Report, 4096)
		g.boxes[id] = ch
	}
	return ch
}

// await returns the next report taken of sandbox id of kind at gen, passing
// over others (heartbeats, say); it fails the test after wait.
func (g *gateway) await(t testing.TB, id, kind string, gen int64) compute.Report {
	t.Helper()
	g.mu.Lock()
	ch := g.box(id)
	g.mu.Unlock()
	timeout := time.After(wait)
	for {
		select {
		case r := <-ch:
			if r.Kind == kind && r.Generation == gen {
				return r
			}
		case <-timeout:
			t.Fatalf("no %s report of generation %d of %s in %s", kind, gen, id, wait)
		}
	}
}

// newDriver is a process driver on a fresh data directory, reporting to g,
// with cfg's changes. At cleanup every sandbox left is deleted, and no
// process and no cgroup of this driver may be left.
func newDriver(t testing.TB, g *gateway, mod func(*process.Config)) (*process.Driver, process.Config) {
	t.Helper()
	cfg := process.Config{Data: t.TempDir(), NATSURL: g.url, Binary: torporBin, Heartbeat: 100 * time.Millisecond, Grace: time.Second}
	if mod != nil {
		mod(&cfg)
	}
	d, err := process.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanUp(t, d, cfg.Data) })
	return d, cfg
}

// cleanUp deletes every sandbox left under data and checks that nothing of
// them is: no process naming data on its command line, no cgroup named
// after one of them.
func cleanUp(t testing.TB, d *process.Driver, data string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(data, "process"))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
		if t.Failed() {
			for _, f := range []string{"supervisor.log", "stderr"} {
				b, _ := os.ReadFile(filepath.Join(data, "process", e.Name(), f))
				t.Logf("%s of %s:\n%s", f, e.Name(), b)
			}
		}
		if err := d.Delete(ctx, compute.Spec{SandboxID: e.Name()}); err != nil {
			t.Errorf("delete %s at cleanup: %v", e.Name(), err)
		}
	}
	for _, pid := range processesNaming(data) {
		t.Errorf("process %d is left: %s", pid, cmdline(pid))
	}
	for _, id := range ids {
		if left, _ := filepath.Glob("/sys/fs/cgroup/*/torpor-" + id); len(left) > 0 {
			t.Errorf("cgroups left: %v", left)
		}
	}
}

// processesNaming lists the live processes whose command line holds s.
func processesNaming(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if strings.Contains(cmdline(pid), s) && !zombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// alive says whether pid runs (not a zombie).
func alive(pid int) bool { return pid > 0 && !zombie(pid) }

func newSpec(command ...string) compute.Spec {
	return compute.Spec{SandboxID: uuid.Must(uuid.NewV7()).String(), Node: "n1", Command: command}
}

func ctx(t testing.TB) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

// needFreezer skips a test of a freezer this machine lacks, saying so
// loudly. Under CI=true, a machine with no cgroup freezer at all fails the
// cgroup tests instead: CI machines have one (DESIGN.md), and a missing one
// is a broken machine, not a pass.
func needFreezer(t testing.TB, kind string) {
	t.Helper()
	err := process.Available(kind)
	if err == nil {
		return
	}
	none := process.Available(process.FreezerV2) != nil && process.Available(process.FreezerV1) != nil
	if kind != process.FreezerSignal && none && os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and no cgroup freezer works here: %v", err)
	}
	t.Skipf("SKIPPED, NOT PASSED: %s does not work here: %v", kind, err)
}

// startReady starts generation gen of spec and waits for its attach.
func startReady(t testing.TB, d *process.Driver, g *gateway, spec compute.Spec, gen int64) {
	t.Helper()
	if err := d.Start(ctx(t), compute.Start{Spec: spec, Generation: gen, Credential: cred(gen)}); err != nil {
		t.Fatalf("start generation %d: %v", gen, err)
	}
	g.await(t, spec.SandboxID, compute.ReportAttached, gen)
}

// observe checks the driver observes spec's sandbox in state at gen.
func observe(t testing.TB, d *process.Driver, spec compute.Spec, state compute.State, gen int64) compute.Observation {
	t.Helper()
	o, err := d.Observe(ctx(t), spec)
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	if o.State != state || o.Generation != gen {
		t.Fatalf("observed %+v, want %s at generation %d", o, state, gen)
	}
	return o
}

// eventually waits until cond holds, polling: for files a workload writes,
// which tell of no change any other way.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
