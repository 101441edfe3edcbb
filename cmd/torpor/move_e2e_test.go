package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute/vm"
)

// vmCounts are the counts a counting guest wrote on its console (the last
// 10000 lines of it), in order.
func vmCounts(t *testing.T, c *torpor.Client, id string) []int {
	t.Helper()
	b, err := c.Logs(context.Background(), id, 10000)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "count "); ok {
			if k, err := strconv.Atoi(v); err == nil {
				out = append(out, k)
			}
		}
	}
	return out
}

// TestVMMovesToAnotherNode: a serve drives nodes n1 and n2 through their
// `torpor driver` processes (each its own data directory, one NATS) and n3,
// whose driver is down. A VM sandbox created on n1 counts; suspended there
// and resumed with node n2, it counts on on n2 from where it was, under
// generation 2, the view names n2 (and, before the resume, said the state
// was movable: exported ahead), n1 holds nothing of it and no snapshot
// object is left. A resume to n3 waits for it until the deadline, which
// leaves the sandbox suspended on n2 with its state held. Unknown nodes are
// INVALID_ARGUMENT; the log passes the checker.
func TestVMMovesToAnotherNode(t *testing.T) {
	kernel := vmKernel(t)
	dir, d1, d2 := t.TempDir(), t.TempDir(), t.TempDir()
	t.Cleanup(func() { deleteVMSandboxes(t, d1); deleteVMSandboxes(t, d2) })
	c := serveProcess(t, dir, "--remote-nodes", "n1,n2,n3", "--deadline", "30s")
	for node, data := range map[string]string{"n1": d1, "n2": d2} {
		startDriver(t, "--node", node, "--drivers", "vm", "--nats-url", c.nats, "--nats-creds", credsFile(t, dir, "driver", node), "--data", data, "--vm-kernel", kernel)
	}
	cl := c.client()
	ctx := context.Background()

	for _, node := range []string{"n9", "local2"} {
		_, err := cl.Create(ctx, torpor.CreateRequest{Driver: "vm", Node: node, Command: []string{"true"}}, "")
		if events.CodeOf(err) != events.CodeInvalidArgument || !strings.Contains(err.Error(), "unknown node") {
			t.Fatalf("create on node %s: %v, want INVALID_ARGUMENT, unknown node", node, err)
		}
	}
	v, err := cl.Create(ctx, torpor.CreateRequest{Driver: "vm", Node: "n1", Command: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo count $i; sleep 0.1; done"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Wait(ctx, v.ID, events.PhaseReady, 3*time.Minute); err != nil || got.Phase != events.PhaseReady || got.Node != "n1" {
		t.Fatalf("the VM sandbox on n1: %+v, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(d1, "vm", v.ID)); err != nil {
		t.Fatalf("n1's driver does not hold the sandbox: %v", err)
	}
	eventually(t, "the guest counts to 5", func() bool { return vmCount(t, cl, v.ID) >= 5 })
	if _, err := cl.Lifecycle(ctx, "suspend", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, cl, v.ID, events.PhaseSuspended)
	at := vmCount(t, cl, v.ID)
	// Issue 29: once n1's export ahead finished, the view says the state
	// is movable, with its size (n1's driver over the bus, the sagas' note).
	eventually(t, "the view says the suspended state is movable", func() bool {
		got, err := cl.Get(ctx, v.ID)
		return err == nil && got.Restore.Movable && got.Restore.MovableBytes > 0 && got.Restore.Held
	})

	_, err = cl.Resume(ctx, v.ID, torpor.ResumeOptions{Node: "n9"}, "")
	if events.CodeOf(err) != events.CodeInvalidArgument || !strings.Contains(err.Error(), "unknown node") {
		t.Fatalf("resume on node n9: %v, want INVALID_ARGUMENT, unknown node", err)
	}
	if _, err := cl.Resume(ctx, v.ID, torpor.ResumeOptions{Node: "n2"}, ""); err != nil {
		t.Fatal(err)
	}
	got, err := cl.Wait(ctx, v.ID, events.PhaseReady, time.Minute)
	if err != nil || got.Generation != 2 || got.Node != "n2" || got.LastOutcome != events.OutcomeRestored || !got.Restore.Consumed {
		h, _ := cl.History(ctx, v.ID, 0)
		for _, e := range h {
			t.Logf("history: %d %s %s", e.Seq, e.Type, e.Data)
		}
		t.Fatalf("resumed on n2: %+v, %v; want generation 2 on n2, restored", got, err)
	}
	eventually(t, "the guest counts on on n2", func() bool { return vmCount(t, cl, v.ID) > at+2 })
	if counts := vmCounts(t, cl, v.ID); len(counts) == 0 || counts[0] <= at-1 || counts[0] == 1 {
		t.Fatalf("n2's console starts at count %v, want it to go on from %d", counts[:min(len(counts), 3)], at)
	}
	eventually(t, "n1 holds nothing of the sandbox", func() bool {
		_, err := os.Stat(filepath.Join(d1, "vm", v.ID))
		return os.IsNotExist(err)
	})
	if n := snapshotObjects(t, c.nats, dir); n != 0 {
		t.Fatalf("%d snapshot objects left after the move", n)
	}

	// n3 is down: the resume waits for it until the deadline, and the
	// sandbox is suspended again on n2, its state held.
	if _, err := cl.Lifecycle(ctx, "suspend", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, cl, v.ID, events.PhaseSuspended)
	acc, err := cl.Resume(ctx, v.ID, torpor.ResumeOptions{Node: "n3"}, "")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if got, _ := cl.Get(ctx, v.ID); got.Phase != events.PhaseStarting {
		t.Fatalf("resuming on a node that is down: %+v, want it waiting in starting", got)
	}
	got, err = cl.WaitAfter(ctx, v.ID, events.PhaseSuspended, acc.Seq, 2*time.Minute)
	if err != nil || got.Node != "n2" || !got.Restore.Held {
		t.Fatalf("after the deadline: %+v, %v; want suspended on n2, its state held", got, err)
	}
	if _, err := cl.Resume(ctx, v.ID, torpor.ResumeOptions{}, ""); err != nil {
		t.Fatal(err)
	}
	if got, err := cl.Wait(ctx, v.ID, events.PhaseReady, time.Minute); err != nil || got.Node != "n2" || got.Generation != 4 {
		t.Fatalf("resumed again on n2: %+v, %v", got, err)
	}
	if _, err := cl.Delete(ctx, v.ID, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, cl, v.ID, events.PhaseDeleted)
	if _, err := os.Stat(filepath.Join(d2, "vm", v.ID)); !os.IsNotExist(err) {
		t.Fatalf("n2 still holds the deleted sandbox: %v", err)
	}
	if code, out, stderr := cli(t, "http://"+c.http, "check"); code != 0 || !strings.Contains(out, ": 0 violations") {
		t.Fatalf("check: %d %s %s", code, out, stderr)
	}
}

// snapshotObjects counts the objects of torpor_snapshots on the NATS at url.
func snapshotObjects(t *testing.T, url, dir string) int {
	t.Helper()
	nc, err := nats.Connect(url, serviceOptions(t, dir)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store, err := js.ObjectStore(context.Background(), vm.SnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := store.List(context.Background())
	if err != nil && err != jetstream.ErrNoObjectsFound {
		t.Fatal(err)
	}
	return len(infos)
}
