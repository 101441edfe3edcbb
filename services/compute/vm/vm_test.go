package vm_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/remote"
	"github.com/torpor/torpor/services/compute/vm"
)

// wait bounds every wait of these tests (a TCG boot takes a few seconds).
const wait = 3 * time.Minute

var torporBin string

func TestMain(m *testing.M) { drivertest.Main(m, &torporBin) }

// kernel is the guest kernel of these tests ($TORPOR_VM_KERNEL, else where
// deploy/vm-kernel puts it). A machine without QEMU or a kernel fails the
// test under CI=true (.ci/run installs both) and skips it loudly elsewhere.
func kernel(t testing.TB) string {
	t.Helper()
	k := os.Getenv(vm.KernelEnv)
	if k == "" {
		k = "/var/lib/torpor/vm/vmlinuz"
	}
	var miss []string
	if _, err := os.Stat(k); err != nil {
		miss = append(miss, "a guest kernel (deploy/vm-kernel, or $"+vm.KernelEnv+"): "+err.Error())
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		miss = append(miss, "QEMU (apt-get install qemu-system-x86)")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		miss = append(miss, "busybox-static")
	}
	if len(miss) > 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and the vm driver's parts are missing: %s", strings.Join(miss, "; "))
		}
		t.Skipf("SKIPPED, NOT PASSED: the vm driver's parts are missing: %s", strings.Join(miss, "; "))
	}
	return k
}

func ctx(t testing.TB) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

// newDriver is a vm driver of node on a fresh data directory reporting to
// g, with snapshots in g's object store; at cleanup every sandbox left is
// deleted and no process of the driver may be left.
func newDriver(t testing.TB, g *drivertest.Gateway, mod func(*vm.Config)) (*vm.Driver, vm.Config) {
	t.Helper()
	g.Wait = wait
	store, err := g.JS.CreateOrUpdateObjectStore(context.Background(), jetstream.ObjectStoreConfig{Bucket: vm.SnapshotBucket})
	if err != nil {
		t.Fatal(err)
	}
	cfg := vm.Config{Data: t.TempDir(), NATSURL: g.URL, Binary: torporBin, Kernel: kernel(t), Accel: vm.AccelTCG, Heartbeat: 200 * time.Millisecond, Snapshots: store}
	if mod != nil {
		mod(&cfg)
	}
	d, err := vm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close() // the spare supervisor goes
		entries, _ := os.ReadDir(filepath.Join(cfg.Data, "vm"))
		for _, e := range entries {
			if e.Name() == "images" || strings.HasPrefix(e.Name(), ".") {
				continue // the images, a spare supervisor's log
			}
			if t.Failed() {
				for _, f := range []string{"supervisor.log", "console.log"} {
					b, _ := os.ReadFile(filepath.Join(cfg.Data, "vm", e.Name(), f))
					t.Logf("%s of %s:\n%s", f, e.Name(), b)
				}
			}
			if err := d.Delete(context.Background(), compute.Spec{SandboxID: e.Name()}); err != nil {
				t.Errorf("delete %s at cleanup: %v", e.Name(), err)
			}
		}
		for _, pid := range drivertest.ProcessesNaming(cfg.Data) {
			t.Errorf("process %d is left: %s", pid, drivertest.Cmdline(pid))
		}
	})
	return d, cfg
}

func spec(node string, command ...string) compute.Spec {
	return compute.Spec{SandboxID: uuid.Must(uuid.NewV7()).String(), Node: node, Command: command}
}

func TestContract(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Harness {
		g := drivertest.NewGateway(t)
		d, _ := newDriver(t, g, nil)
		return drivertest.Harness{Driver: d, Reports: g.All, Timeout: wait, Spec: func(id string) compute.Spec {
			return compute.Spec{SandboxID: id, Node: "n1", Command: []string{"sleep", "3600"}}
		}}
	})
}

// counter counts in the guest, a line a tenth of a second.
var counter = []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo count $i; sleep 0.1; done"}

// lastCount is the last count in the console of spec's sandbox.
func lastCount(t testing.TB, d *vm.Driver, s compute.Spec) int {
	t.Helper()
	b, err := d.Logs(ctx(t), s, 5)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "count "); ok {
			if k, err := strconv.Atoi(v); err == nil {
				n = k
			}
		}
	}
	return n
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func start(t testing.TB, d *vm.Driver, g *drivertest.Gateway, s compute.Spec, gen int64) {
	t.Helper()
	if err := d.Start(ctx(t), compute.Start{Spec: s, Generation: gen, Credential: drivertest.Cred(gen)}); err != nil {
		t.Fatalf("start generation %d: %v", gen, err)
	}
	g.Await(t, s.SandboxID, compute.ReportAttached, gen)
}

// qemus lists the QEMU processes whose command line names dir.
func qemus(dir string) []int {
	var out []int
	for _, pid := range drivertest.ProcessesNaming(dir) {
		if strings.HasPrefix(drivertest.Cmdline(pid), "qemu-system") {
			out = append(out, pid)
		}
	}
	return out
}

// TestCounterContinues: a counting guest is suspended (no QEMU of it left,
// its snapshot held), resumed under generation 2, and counts on from where
// it was, not from 1.
func TestCounterContinues(t *testing.T) {
	g := drivertest.NewGateway(t)
	d, cfg := newDriver(t, g, nil)
	s := spec("n1", counter...)
	start(t, d, g, s, 1)
	eventually(t, "the guest counts to 5", func() bool { return lastCount(t, d, s) >= 5 })
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ref, drivertest.Cred(1)) {
		t.Fatalf("the reference %q carries the credential", ref)
	}
	at := lastCount(t, d, s)
	dir := filepath.Join(cfg.Data, "vm", s.SandboxID)
	if left := qemus(dir); len(left) > 0 {
		t.Fatalf("QEMU processes left after the suspend: %v", left)
	}
	if o, err := d.Observe(ctx(t), s); err != nil || o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("observed %+v, %v; want frozen behind %s", o, err, ref)
	}
	time.Sleep(500 * time.Millisecond)
	if n := lastCount(t, d, s); n != at {
		t.Fatalf("the suspended guest counted on: %d, then %d", at, n)
	}
	called := time.Now()
	res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: ref})
	answered := time.Now()
	if err != nil || !res.Consumed {
		t.Fatalf("resume: %+v, %v", res, err)
	}
	// The stages of the restore (README "Resume latency"): began after the
	// call, the cont answered before the answer, in order.
	if res.RestoreStartedAt.Before(called) || res.RunningAt.Before(res.RestoreStartedAt) || res.RunningAt.After(answered) {
		t.Errorf("restore started %s, running %s; want both within the call [%s, %s], in order", res.RestoreStartedAt, res.RunningAt, called, answered)
	}
	g.Await(t, s.SandboxID, compute.ReportAttached, 2)
	eventually(t, "the guest counts on", func() bool { return lastCount(t, d, s) > at+3 })
	b, err := d.Logs(ctx(t), s, 0)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(b, []byte("count 1\n")) != 1 {
		t.Fatalf("the guest counted from 1 again (%d times):\n%q", bytes.Count(b, []byte("count 1\n")), b)
	}
	for _, r := range g.Sent(s.SandboxID) {
		if r.Kind == compute.ReportExited {
			t.Fatalf("the suspension was reported as an exit: %+v", r)
		}
	}
	// The reference is used up.
	if res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 3, Credential: drivertest.Cred(3), RestoreRef: ref}); !errors.Is(err, compute.ErrUnknownRef) || res.Consumed {
		t.Fatalf("a second resume of the consumed reference: %+v, %v", res, err)
	}
}

// TestMovesToAnotherNode: n1 suspends, exports the snapshot to the object
// store, n2 restores it and the guest counts on there; n1, told to discard
// its copy, holds nothing of the sandbox, and the object is gone.
func TestMovesToAnotherNode(t *testing.T) {
	g := drivertest.NewGateway(t)
	n1, cfg1 := newDriver(t, g, nil)
	n2, cfg2 := newDriver(t, g, nil)
	s := spec("n1", counter...)
	start(t, n1, g, s, 1)
	eventually(t, "the guest counts to 5", func() bool { return lastCount(t, n1, s) >= 5 })
	ref, err := n1.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	at := lastCount(t, n1, s)
	moved, err := n1.Export(ctx(t), s, ref)
	if err != nil {
		t.Fatal(err)
	}
	again, err := n1.Export(ctx(t), s, ref)
	if err != nil || again != moved {
		t.Fatalf("a repeated export: %q, %v; want %q", again, err, moved)
	}
	info := objectOf(t, cfg1, moved)
	t.Logf("snapshot object: %d bytes for 128 MiB of guest memory (%.3f)", info.Size, float64(info.Size)/float64(128<<20))
	if info.Size > 128<<20/4 {
		t.Errorf("the movable snapshot of an idle guest is %d bytes, more than a quarter of its memory", info.Size)
	}
	s2 := s
	s2.Node = "n2"
	res, err := n2.Resume(ctx(t), compute.Resume{Spec: s2, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: moved})
	if err != nil || !res.Consumed {
		t.Fatalf("resume on n2: %+v, %v", res, err)
	}
	g.Await(t, s.SandboxID, compute.ReportAttached, 2)
	eventually(t, "the guest counts on on n2", func() bool { return lastCount(t, n2, s2) > at })
	if err := n1.Discard(ctx(t), s, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cfg1.Data, "vm", s.SandboxID)); !os.IsNotExist(err) {
		t.Fatalf("n1 still holds the sandbox's directory: %v", err)
	}
	if _, err := cfg2.Snapshots.GetInfo(ctx(t), objectName(moved)); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("the restored snapshot's object is still there: %v", err)
	}
	if o, _ := n1.Observe(ctx(t), s); o.State != compute.StateGone {
		t.Fatalf("n1 observes %+v, want gone", o)
	}
}

func objectName(ref string) string {
	rest := strings.TrimPrefix(ref, "vmobj:")
	return rest[:strings.LastIndexByte(rest, ':')]
}

func objectOf(t testing.TB, cfg vm.Config, ref string) *jetstream.ObjectInfo {
	t.Helper()
	info, err := cfg.Snapshots.GetInfo(ctx(t), objectName(ref))
	if err != nil {
		t.Fatalf("the snapshot object of %s: %v", ref, err)
	}
	return info
}

// TestCorruptSnapshot: a snapshot whose device state does not match its
// digest is refused before it is consumed (held, retryable), locally and
// from the object store; a start then boots the sandbox afresh.
func TestCorruptSnapshot(t *testing.T) {
	g := drivertest.NewGateway(t)
	d, cfg := newDriver(t, g, nil)
	s := spec("n1", counter...)
	start(t, d, g, s, 1)
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	moved, err := d.Export(ctx(t), s, ref)
	if err != nil {
		t.Fatal(err)
	}
	states, _ := filepath.Glob(filepath.Join(cfg.Data, "vm", s.SandboxID, "snap-*.state"))
	if len(states) != 1 {
		t.Fatalf("snapshot files: %v", states)
	}
	flip(t, states[0])
	res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: ref})
	if err == nil || res.Consumed {
		t.Fatalf("resume of a corrupt snapshot: %+v, %v; want a failure, nothing consumed", res, err)
	}
	if o, _ := d.Observe(ctx(t), s); o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("after the refused resume: %+v, want still frozen behind %s", o, ref)
	}
	// The object, corrupted in the store, is refused too.
	info := objectOf(t, cfg, moved)
	data, err := cfg.Snapshots.GetBytes(ctx(t), info.Name)
	if err != nil {
		t.Fatal(err)
	}
	// Cut short: a flipped byte of the compressed stream can land where
	// deflate ignores it (an unused code length), and the object is then
	// whole; a CI run saw that once.
	data = data[:len(data)/2]
	if _, err := cfg.Snapshots.PutBytes(ctx(t), info.Name, data); err != nil {
		t.Fatal(err)
	}
	s2 := s
	s2.Node = "n2"
	n2, _ := newDriver(t, g, nil)
	res, err = n2.Resume(ctx(t), compute.Resume{Spec: s2, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: moved})
	if err == nil || res.Consumed {
		t.Fatalf("resume of a corrupt object: %+v, %v; want a failure, nothing consumed", res, err)
	}
	if _, err := cfg.Snapshots.GetInfo(ctx(t), info.Name); err != nil {
		t.Fatalf("a refused object is kept (the resume stays retryable): %v", err)
	}
	// A start boots afresh, discarding the snapshot.
	start(t, d, g, s, 2)
	eventually(t, "the fresh guest counts", func() bool { return lastCount(t, d, s) >= 1 })
	if left, _ := filepath.Glob(filepath.Join(cfg.Data, "vm", s.SandboxID, "snap-*")); len(left) > 0 {
		t.Fatalf("the discarded snapshot's files are left: %v", left)
	}
}

func flip(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestDiesAfterCont: a restored guest whose QEMU dies right after it was
// continued is a failure after consumption; the reference is not held.
func TestDiesAfterCont(t *testing.T) {
	g := drivertest.NewGateway(t)
	d, _ := newDriver(t, g, func(c *vm.Config) {
		vm.SetAfterCont(c, func(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL); time.Sleep(100 * time.Millisecond) })
	})
	s := spec("n1", counter...)
	start(t, d, g, s, 1)
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: ref})
	if err == nil || !res.Consumed {
		t.Fatalf("resume whose guest died: %+v, %v; want a failure after consumption", res, err)
	}
	res, err = d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: ref})
	if err == nil || !res.Consumed {
		t.Fatalf("a repeat of it: %+v, %v; want the same", res, err)
	}
	if o, _ := d.Observe(ctx(t), s); o.State == compute.StateFrozen || o.State == compute.StateRunning {
		t.Fatalf("observed %+v after the guest died", o)
	}
}

// TestInterruptedDriver: what a driver that died in the middle of a
// suspend or a resume left is settled by the next Observe (or a repeat of
// the resume), so that what it says is what is: a guest paused by a
// suspend that recorded nothing runs on (no half-written snapshot left); a
// QEMU still there behind a recorded suspension ends, the sandbox frozen;
// a restored guest never continued runs on under its new generation.
func TestInterruptedDriver(t *testing.T) {
	g := drivertest.NewGateway(t)
	var crash atomic.Bool
	d, cfg := newDriver(t, g, func(c *vm.Config) {
		vm.SetBeforeCont(c, func() error {
			if crash.Load() {
				return errors.New("the driver died before cont")
			}
			return nil
		})
	})
	s := spec("n1", counter...)
	dir := filepath.Join(cfg.Data, "vm", s.SandboxID)
	start(t, d, g, s, 1)
	eventually(t, "the guest counts to 3", func() bool { return lastCount(t, d, s) >= 3 })
	paused := func(what string) int {
		t.Helper()
		at := lastCount(t, d, s)
		time.Sleep(500 * time.Millisecond)
		if n := lastCount(t, d, s); n != at {
			t.Fatalf("%s: the guest counted on (%d, then %d); want it paused", what, at, n)
		}
		return at
	}
	countsOn := func(what string, at int) {
		t.Helper()
		eventually(t, what+": the guest counts on", func() bool { return lastCount(t, d, s) > at+3 })
	}

	if _, err := vm.InterruptSuspend(ctx(t), d, s, false); err != nil {
		t.Fatal(err)
	}
	at := paused("a suspend interrupted after stop")
	if o, err := d.Observe(ctx(t), s); err != nil || o.State != compute.StateRunning || o.Generation != 1 {
		t.Fatalf("observed %+v, %v; want generation 1 running", o, err)
	}
	countsOn("observed after the interrupted suspend", at)
	if left, _ := filepath.Glob(filepath.Join(dir, ".snap-*")); len(left) > 0 {
		t.Fatalf("half-written snapshots left: %v", left)
	}

	ref, err := vm.InterruptSuspend(ctx(t), d, s, true)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := d.Observe(ctx(t), s); err != nil || o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("observed %+v, %v; want frozen behind %s", o, err, ref)
	}
	if left := qemus(dir); len(left) > 0 {
		t.Fatalf("QEMU left behind the recorded suspension: %v", left)
	}

	crash.Store(true)
	if res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: ref}); err == nil {
		t.Fatalf("resume with the driver dying before cont: %+v", res)
	}
	crash.Store(false)
	at = paused("a resume interrupted before cont")
	if o, err := d.Observe(ctx(t), s); err != nil || o.State != compute.StateRunning || o.Generation != 2 {
		t.Fatalf("observed %+v, %v; want generation 2 running", o, err)
	}
	countsOn("observed after the interrupted resume", at)
	g.Await(t, s.SandboxID, compute.ReportAttached, 2)

	// The same, settled by the resume's repeat rather than by Observe.
	ref, err = d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 2})
	if err != nil {
		t.Fatal(err)
	}
	crash.Store(true)
	if _, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 3, Credential: drivertest.Cred(3), RestoreRef: ref}); err == nil {
		t.Fatal("resume with the driver dying before cont: no error")
	}
	crash.Store(false)
	at = paused("a resume interrupted before cont, again")
	if res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 3, Credential: drivertest.Cred(3), RestoreRef: ref}); err != nil || !res.Consumed {
		t.Fatalf("the resume's repeat: %+v, %v; want consumed", res, err)
	}
	countsOn("after the resume's repeat", at)
	g.Await(t, s.SandboxID, compute.ReportAttached, 3)
	for _, r := range g.Sent(s.SandboxID) {
		if r.Kind == compute.ReportExited {
			t.Fatalf("reported an exit: %+v", r)
		}
	}
}

// TestExitCode: the workload's exit code in the guest is reported.
func TestExitCode(t *testing.T) {
	g := drivertest.NewGateway(t)
	d, _ := newDriver(t, g, nil)
	s := spec("n1", "sh", "-c", "echo bye; exit 7")
	start(t, d, g, s, 1)
	r := g.Await(t, s.SandboxID, compute.ReportExited, 1)
	if r.ExitCode != 7 {
		t.Fatalf("exit code %d, want 7", r.ExitCode)
	}
	eventually(t, "exited", func() bool { o, _ := d.Observe(ctx(t), s); return o.State == compute.StateExited && o.ExitCode == 7 })
	b, _ := d.Logs(ctx(t), s, 10)
	if !bytes.Contains(b, []byte("bye")) {
		t.Fatalf("console: %q, want the workload's output", b)
	}
}

// TestBadInput: what each refusal of the vm driver is.
func TestBadInput(t *testing.T) {
	g := drivertest.NewGateway(t)
	d, _ := newDriver(t, g, nil)
	for _, tc := range []struct {
		name string
		spec compute.Spec
		code events.Code // "" for an uncoded refusal (the gateway makes it INVALID_ARGUMENT)
	}{
		{"memory below the least", compute.Spec{Options: map[string]string{"memory": "8"}, Command: []string{"true"}}, ""},
		{"memory above the most", compute.Spec{Options: map[string]string{"memory": "999999"}, Command: []string{"true"}}, ""},
		{"memory no number", compute.Spec{Options: map[string]string{"memory": "lots"}, Command: []string{"true"}}, ""},
		{"cpus zero", compute.Spec{Options: map[string]string{"cpus": "0"}, Command: []string{"true"}}, ""},
		{"an unknown option", compute.Spec{Options: map[string]string{"disk": "1G"}, Command: []string{"true"}}, ""},
		{"no command", compute.Spec{}, ""},
		{"an env name sh cannot export", compute.Spec{Env: map[string]string{"A-B": "1"}, Command: []string{"true"}}, ""},
	} {
		err := d.ValidateSpec(tc.spec)
		if err == nil || events.CodeOf(err) != events.CodeInternal {
			t.Errorf("%s: %v (%s), want a refusal", tc.name, err, events.CodeOf(err))
		}
	}
	if err := d.ValidateSpec(compute.Spec{Options: map[string]string{"memory": "256", "cpus": "2"}, Command: []string{"true"}}); err != nil {
		t.Errorf("a good spec: %v", err)
	}
	// A node without the kernel or QEMU: FAILED_PRECONDITION, naming it.
	for _, mod := range []func(*vm.Config){
		func(c *vm.Config) { c.Kernel = "/nonexistent/vmlinuz" },
		func(c *vm.Config) { c.QEMU = "/nonexistent/qemu" },
	} {
		cfg := vm.Config{Data: t.TempDir(), NATSURL: g.URL, Binary: torporBin, Kernel: kernel(t)}
		mod(&cfg)
		bare, err := vm.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = bare.ValidateSpec(compute.Spec{Command: []string{"true"}})
		if events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "/nonexistent/") {
			t.Errorf("a node missing a part: %v (%s), want FAILED_PRECONDITION naming it", err, events.CodeOf(err))
		}
	}
	// A command the guest does not have is refused at start, again on a repeat.
	s := spec("n1", "python3", "-c", "print(1)")
	for range 2 {
		err := d.Start(ctx(t), compute.Start{Spec: s, Generation: 1, Credential: drivertest.Cred(1)})
		if !errors.Is(err, compute.ErrRejected) || !strings.Contains(err.Error(), "python3") {
			t.Fatalf("start of a command the guest lacks: %v, want ErrRejected naming it", err)
		}
	}
	// A reference of another driver's making.
	s = spec("n1", counter...)
	if res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: "vmobj:" + s.SandboxID + "/x:" + strings.Repeat("0", 64)}); !errors.Is(err, compute.ErrUnknownRef) || res.Consumed {
		t.Fatalf("resume of an object that does not exist: %+v, %v", res, err)
	}
}

// TestContractOverTheBus runs the contract suite against the vm driver
// behind the bus (remote.Serve and remote.Client), as `torpor driver`
// serves it to a service on another host.
func TestContractOverTheBus(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Harness {
		g := drivertest.NewGateway(t)
		d, _ := newDriver(t, g, nil)
		nc := g.JS.Conn()
		srv, err := remote.Serve(context.Background(), nc, "n1", compute.Registry{"vm": d}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Stop() })
		return drivertest.Harness{Driver: remote.NewClient(nc, "n1", "vm"), Reports: g.All, Timeout: wait, Spec: func(id string) compute.Spec {
			return compute.Spec{SandboxID: id, Node: "n1", Command: []string{"sleep", "3600"}}
		}}
	})
}

// TestHeartbeatsSayBusy: the heartbeats of a guest spinning on its CPU (no
// API call, no forward traffic) say it was active, booted and restored
// alike, and those of the same guest once it sleeps never do (README
// "Activity": the CPU time of QEMU's vCPU threads advanced by more than a
// fiftieth of the interval, over TCG's idle baseline, since the beat
// before). One guest serves all: it spins for its first 12 seconds (of its
// own clock, which stands still while it is suspended), then sleeps.
func TestHeartbeatsSayBusy(t *testing.T) {
	g := drivertest.NewGateway(t)
	d, _ := newDriver(t, g, func(c *vm.Config) { c.Heartbeat = time.Second })
	s := spec("n1", "sh", "-c", "end=$(($(date +%s)+12)); while [ $(date +%s) -lt $end ]; do :; done; echo rested; sleep 3600")
	start(t, d, g, s, 1)
	beats := func(gen int64) (active []bool) {
		for _, r := range g.Sent(s.SandboxID) {
			if r.Kind == compute.ReportHeartbeat && r.Generation == gen {
				active = append(active, r.Active)
			}
		}
		return active
	}
	busyBeats := func(t *testing.T, gen int64) {
		t.Helper()
		eventually(t, "two busy beats of the spinning guest", func() bool {
			n := 0
			for _, a := range beats(gen) {
				if a {
					n++
				}
			}
			return n >= 2
		})
	}
	t.Run("busy", func(t *testing.T) { busyBeats(t, 1) })
	t.Run("busy restored", func(t *testing.T) {
		ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: ref}); err != nil || !res.Consumed {
			t.Fatalf("resume: %+v, %v", res, err)
		}
		g.Await(t, s.SandboxID, compute.ReportAttached, 2)
		busyBeats(t, 2)
	})
	t.Run("idle", func(t *testing.T) {
		eventually(t, "the guest stops spinning", func() bool {
			b, err := d.Logs(ctx(t), s, 5)
			return err == nil && bytes.Contains(b, []byte("rested"))
		})
		// The two beats after it may have measured some of the spinning.
		from := len(beats(2)) + 2
		eventually(t, "ten beats of the sleeping guest", func() bool { return len(beats(2)) >= from+10 })
		if got := beats(2)[from : from+10]; slices.Contains(got, true) {
			t.Fatalf("the sleeping guest's beats say active: %v, want none", got)
		}
	})
}
