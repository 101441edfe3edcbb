package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute/drivertest"
)

// TestVMKillDuringSuspendAndResume kills, with SIGKILL, `torpor serve` (the
// vm driver in it) or the `torpor driver` process that serves the VM's
// node, right after the suspend intent is in the log (the driver's QMP
// work under way or about to be), or once the resume's new QEMU runs (it
// waits for the snapshot or has it), starts it again on the same data, and
// checks that the sandbox converges (suspended with its state held, or
// restored under generation 2), that one snapshot is held while suspended
// and none is left once it was restored (none orphaned, none used twice:
// each intent's outcome once in the log), that one QEMU runs the restored
// guest, and that `torpor check` finds the log sound.
func TestVMKillDuringSuspendAndResume(t *testing.T) {
	kernel := vmKernel(t)
	for _, c := range []struct{ kill, verb string }{
		{"serve", "suspend"}, {"serve", "resume"}, {"driver", "suspend"}, {"driver", "resume"},
	} {
		t.Run("kill "+c.kill+" during a "+c.verb, func(t *testing.T) {
			dir, data := t.TempDir(), t.TempDir()
			// The supervisors keep the NATS URL they started with: the
			// service comes back on the same one.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			natsListen := ln.Addr().String()
			ln.Close()
			args := []string{"--nats-listen", natsListen, "--deadline", "1m", "--vm-kernel", kernel}
			node := ""
			if c.kill == "driver" {
				args, node = append(args, "--remote-nodes", "n1"), "n1"
			} else {
				data = dir
			}
			t.Cleanup(func() { deleteVMSandboxes(t, data) })
			a := serveProcess(t, dir, args...)
			var drv *driverProcess
			startNode := func() {
				drv = startDriver(t, "--node", "n1", "--drivers", "vm", "--nats-url", a.nats, "--nats-creds", credsFile(t, dir, "driver", "n1"), "--data", data, "--vm-kernel", kernel)
			}
			if node != "" {
				startNode()
			}
			ctx := context.Background()
			v, err := a.client().Create(ctx, torpor.CreateRequest{Driver: "vm", Node: node, Command: []string{"sh", "-c", "while :; do sleep 0.1; done"}}, "")
			if err != nil {
				t.Fatal(err)
			}
			if got, err := a.client().Wait(ctx, v.ID, events.PhaseReady, 3*time.Minute); err != nil || got.Phase != events.PhaseReady {
				t.Fatalf("not ready: %+v, %v", got, err)
			}
			want := events.PhaseSuspended
			if c.verb == "resume" {
				acc, err := a.client().Lifecycle(ctx, "suspend", v.ID, false, "")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := a.client().WaitAfter(ctx, v.ID, events.PhaseSuspended, acc.Seq, waitFor); err != nil {
					t.Fatal(err)
				}
				want = events.PhaseReady
			}
			evs := a.watch(t, v.ID)
			if _, err := a.client().Lifecycle(ctx, c.verb, v.ID, false, ""); err != nil {
				t.Fatal(err)
			}
			awaitEvent(t, evs, map[string]string{"suspend": events.TypeSuspendRequested, "resume": events.TypeResumeRequested}[c.verb])
			if c.verb == "resume" {
				// In the middle of the restore: the new QEMU waits for
				// the snapshot, or has it.
				sbx := filepath.Join(data, "vm", v.ID)
				eventually(t, "a restoring QEMU", func() bool {
					for _, pid := range drivertest.ProcessesNaming(sbx) {
						if strings.Contains(drivertest.Cmdline(pid), "-incoming") {
							return true
						}
					}
					return false
				})
			}
			if c.kill == "serve" {
				a.kill()
				a = serveProcess(t, dir, args...)
			} else {
				_ = drv.cmd.Process.Kill()
				<-drv.done
				startNode()
			}
			outcome := map[string]string{"suspend": events.TypeSuspended, "resume": events.TypeResumed}[c.verb]
			// A call in flight to a killed driver is known lost only when
			// the remote client's wait for it ends (30s): then it is asked
			// again, of the restarted driver.
			awaitHistoryFor(t, a, v.ID, outcome, 2*time.Minute)
			got, err := a.client().Wait(ctx, v.ID, want, time.Minute)
			if err != nil {
				t.Fatalf("did not converge to %s: %+v, %v", want, got, err)
			}
			sbx := filepath.Join(data, "vm", v.ID)
			snaps, _ := filepath.Glob(filepath.Join(sbx, "snap-*"))
			halves, _ := filepath.Glob(filepath.Join(sbx, ".snap-*"))
			var qemus []int
			for _, pid := range drivertest.ProcessesNaming(sbx) {
				if strings.HasPrefix(drivertest.Cmdline(pid), "qemu-system") {
					qemus = append(qemus, pid)
				}
			}
			switch c.verb {
			case "suspend":
				if got.Generation != 1 || !got.Restore.Held || len(snaps) != 1 || len(halves) != 0 || len(qemus) != 0 {
					t.Fatalf("after the restart: %+v, snapshots %v, half-written %v, QEMUs %v; want suspended, one snapshot held, no QEMU", got, snaps, halves, qemus)
				}
			case "resume":
				if got.Generation != 2 || got.LastOutcome != events.OutcomeRestored || got.Restore.Held || len(snaps) != 0 || len(qemus) != 1 {
					t.Fatalf("after the restart: %+v, snapshots %v, QEMUs %v; want restored at generation 2, no snapshot left, one QEMU", got, snaps, qemus)
				}
			}
			h, err := a.client().History(ctx, v.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			counts := map[string]int{}
			for _, e := range h {
				counts[e.Type]++
			}
			for _, typ := range []string{events.TypeSuspended, events.TypeRetainedStateConsumed, events.TypeResumed} {
				if counts[typ] > 1 {
					t.Errorf("%d × %s in the history, want at most 1", counts[typ], typ)
				}
			}
			if code, out, stderr := cli(t, "http://"+a.http, "check"); code != 0 || !strings.Contains(out, ": 0 violations") {
				t.Fatalf("check: %d %s %s", code, out, stderr)
			}
		})
	}
}
