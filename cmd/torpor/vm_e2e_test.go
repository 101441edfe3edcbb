package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/vm"
)

// vmKernel is the guest kernel of the VM tests ($TORPOR_VM_KERNEL, else
// where deploy/vm-kernel puts it). A machine without it or QEMU fails under
// CI=true and skips loudly elsewhere.
func vmKernel(t *testing.T) string {
	t.Helper()
	k := os.Getenv(vm.KernelEnv)
	if k == "" {
		k = "/var/lib/torpor/vm/vmlinuz"
	}
	_, kerr := os.Stat(k)
	_, qerr := exec.LookPath("qemu-system-x86_64")
	if kerr != nil || qerr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and the vm driver's parts are missing: kernel %v; QEMU %v", kerr, qerr)
		}
		t.Skipf("SKIPPED, NOT PASSED: the vm driver's parts are missing: kernel %v; QEMU %v", kerr, qerr)
	}
	return k
}

// vmCount is the last count a counting guest wrote on its console.
func vmCount(t *testing.T, c *torpor.Client, id string) int {
	t.Helper()
	b, err := c.Logs(context.Background(), id, 5)
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

// TestVMSandboxSuspendsAndResumes drives a VM sandbox through the real
// serve: a guest counts on its console; suspended, no QEMU of it is left and
// the view says its state is held; resumed, it counts on from where it was
// under generation 2; a corrupted snapshot then fails its resume before the
// consumption (suspended, held) and a start boots it afresh; the log passes
// the checker. A vm create the node cannot run is refused at create, naming
// what is missing.
func TestVMSandboxSuspendsAndResumes(t *testing.T) {
	kernel := vmKernel(t)
	dir := t.TempDir()
	t.Cleanup(func() { deleteVMSandboxes(t, dir) })
	c := serveProcess(t, dir, "--vm-kernel", kernel)
	cl := c.client()
	ctx := context.Background()
	v, err := cl.Create(ctx, torpor.CreateRequest{Driver: "vm", Command: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo count $i; sleep 0.1; done"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	// A TCG boot takes seconds, more on a machine whose cores other tests
	// keep busy (other packages' VMs, the race detector).
	if got, err := cl.Wait(ctx, v.ID, events.PhaseReady, 3*time.Minute); err != nil || got.Phase != events.PhaseReady {
		t.Fatalf("the VM sandbox is not ready: %+v, %v", got, err)
	}
	eventually(t, "the guest counts to 5", func() bool { return vmCount(t, cl, v.ID) >= 5 })

	if _, err := cl.Lifecycle(ctx, "suspend", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	got := mustWait(t, cl, v.ID, events.PhaseSuspended)
	// The snapshot's size is in the view (the device state and the RAM
	// file's allocated bytes: a 128 MiB guest's kernel and userland are
	// megabytes of it), nothing that restores it.
	if !got.Restore.Held || got.Restore.Bytes < 1<<20 || got.Restore.Bytes > 128<<20+1<<20 {
		t.Fatalf("suspended, the view does not hold the state with its size: %+v", got)
	}
	at := vmCount(t, cl, v.ID)
	for _, pid := range drivertest.ProcessesNaming(filepath.Join(dir, "vm", v.ID)) {
		if strings.HasPrefix(drivertest.Cmdline(pid), "qemu-system") {
			t.Fatalf("a QEMU of the suspended sandbox is left: %d", pid)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if n := vmCount(t, cl, v.ID); n != at {
		t.Fatalf("the suspended guest counted on: %d, then %d", at, n)
	}
	if _, err := cl.Resume(ctx, v.ID, torpor.ResumeOptions{}, ""); err != nil {
		t.Fatal(err)
	}
	got = mustWait(t, cl, v.ID, events.PhaseReady)
	if got.Generation != 2 || got.LastOutcome != events.OutcomeRestored || got.Restore.Held || !got.Restore.Consumed {
		t.Fatalf("resumed: %+v, want generation 2, restored, consumed", got)
	}
	eventually(t, "the guest counts on", func() bool { return vmCount(t, cl, v.ID) > at+2 })
	b, err := cl.Logs(ctx, v.ID, 10000)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(b), "count 1\n") != 1 {
		t.Fatalf("the guest counted from 1 again:\n%s", b)
	}

	// A corrupted snapshot fails before its consumption: back to suspended
	// with the state still held (retryable); a start then boots the guest
	// afresh, the snapshot discarded.
	if _, err := cl.Lifecycle(ctx, "suspend", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, cl, v.ID, events.PhaseSuspended)
	states, _ := filepath.Glob(filepath.Join(dir, "vm", v.ID, "snap-*.state"))
	if len(states) != 1 {
		t.Fatalf("snapshots held: %v, want one", states)
	}
	snap, err := os.ReadFile(states[0])
	if err != nil {
		t.Fatal(err)
	}
	snap[len(snap)/2] ^= 0xff
	if err := os.WriteFile(states[0], snap, 0o600); err != nil {
		t.Fatal(err)
	}
	acc, err := cl.Resume(ctx, v.ID, torpor.ResumeOptions{}, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err = cl.WaitAfter(ctx, v.ID, events.PhaseSuspended, acc.Seq, time.Minute)
	if err != nil || got.Phase != events.PhaseSuspended || got.LastOutcome != events.OutcomeRestoreFailed || !got.Restore.Held || got.Restore.Consumed {
		t.Fatalf("the resume of a corrupted snapshot: %+v, %v; want suspended, restore_failed, the state held", got, err)
	}
	if _, err := cl.Lifecycle(ctx, "start", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	got, err = cl.Wait(ctx, v.ID, events.PhaseReady, 3*time.Minute)
	if err != nil || got.Phase != events.PhaseReady || got.Restore.Held {
		t.Fatalf("the start of the suspended sandbox: %+v, %v; want ready, nothing held", got, err)
	}
	eventually(t, "the guest boots afresh and counts", func() bool {
		b, err := cl.Logs(ctx, v.ID, 10000)
		return err == nil && strings.Count(string(b), "count 1\n") == 2
	})
	if left, _ := filepath.Glob(filepath.Join(dir, "vm", v.ID, "snap-*")); len(left) > 0 {
		t.Fatalf("the discarded snapshot is left: %v", left)
	}

	// Bad input at create: memory out of range.
	_, err = cl.Create(ctx, torpor.CreateRequest{Driver: "vm", DriverOptions: map[string]string{"memory": "4"}, Command: []string{"true"}}, "")
	if events.CodeOf(err) != events.CodeInvalidArgument || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("memory out of range: %v, want INVALID_ARGUMENT naming memory", err)
	}
	if _, err := cl.Delete(ctx, v.ID, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, cl, v.ID, events.PhaseDeleted)
	if _, err := os.Stat(filepath.Join(dir, "vm", v.ID)); !os.IsNotExist(err) {
		t.Fatalf("the deleted sandbox's directory is left: %v", err)
	}
	if code, out, stderr := cli(t, "http://"+c.http, "check"); code != 0 || !strings.Contains(out, ": 0 violations") {
		t.Fatalf("check: %d %s %s", code, out, stderr)
	}
}

// TestVMCreateWithoutKernel: a serve with no guest kernel refuses a vm
// create at once, FAILED_PRECONDITION naming the kernel, and records nothing.
func TestVMCreateWithoutKernel(t *testing.T) {
	c := serveProcess(t, t.TempDir(), "--vm-kernel", "/nonexistent/vmlinuz")
	cl := c.client()
	_, err := cl.Create(context.Background(), torpor.CreateRequest{Driver: "vm", Command: []string{"true"}}, "")
	if events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "/nonexistent/vmlinuz") {
		t.Fatalf("a vm create without a kernel: %v, want FAILED_PRECONDITION naming the kernel", err)
	}
	list, err := cl.List(context.Background(), "", "", 0, "")
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("after the refusal: %+v, %v; want nothing recorded", list, err)
	}
}

// deleteVMSandboxes deletes what is left of the vm sandboxes under dir.
func deleteVMSandboxes(t *testing.T, dir string) {
	d, err := vm.New(vm.Config{Data: dir, NATSURL: "nats://127.0.0.1:1"})
	if err != nil {
		t.Error(err)
		return
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "vm"))
	for _, e := range entries {
		if e.Name() == "images" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := d.Delete(context.Background(), compute.Spec{SandboxID: e.Name()}); err != nil {
			t.Errorf("delete %s: %v", e.Name(), err)
		}
	}
}
