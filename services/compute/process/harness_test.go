package process_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/process"
)

// wait bounds every wait of these tests.
const wait = 20 * time.Second

// torporBin is the torpor binary the supervisors run: the tests run in the
// test binary, which has no `supervise` verb.
var torporBin string

func TestMain(m *testing.M) { drivertest.Main(m, &torporBin) }

// cred is the credential the tests mint for generation gen (as drivertest does).
func cred(gen int64) string { return fmt.Sprintf("credential-of-%d", gen) }

// gateway is the fake gateway of drivertest.
type gateway = drivertest.Gateway

func newGateway(t testing.TB) *gateway { return drivertest.NewGateway(t) }

// newDriver is a process driver on a fresh data directory, reporting to g,
// with cfg's changes. At cleanup every sandbox left is deleted, and no
// process and no cgroup of this driver may be left.
func newDriver(t testing.TB, g *gateway, mod func(*process.Config)) (*process.Driver, process.Config) {
	t.Helper()
	cfg := process.Config{Data: t.TempDir(), NATSURL: g.URL, Binary: torporBin, Heartbeat: 100 * time.Millisecond, Grace: time.Second}
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

// processesNaming, cmdline and alive are drivertest's.
var (
	processesNaming = drivertest.ProcessesNaming
	cmdline         = drivertest.Cmdline
	alive           = drivertest.Alive
)

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
	g.Await(t, spec.SandboxID, compute.ReportAttached, gen)
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
