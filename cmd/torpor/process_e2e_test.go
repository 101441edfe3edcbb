package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
)

// TestProcessSandboxAcrossRestarts drives a process sandbox through the
// real binary: created, it counts in its working directory; `torpor serve`
// shut down (^C to its process group) leaves it counting, and started again
// finds it ready (and takes the exit of another sandbox that ended while it
// was down);
// it suspends and resumes (generation 2, the same process counting on),
// stops and starts (generation 3, counting afresh), and is deleted with
// nothing of it left; `torpor check` finds the log sound.
func TestProcessSandboxAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { deleteProcessSandboxes(t, dir) })
	// The supervisors keep the NATS URL they started with: the service
	// comes back on the same one, as it does on its default port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	natsListen := ln.Addr().String()
	ln.Close()
	c := serveProcess(t, dir, "--nats-listen", natsListen)
	ctx := context.Background()
	v, err := c.client().Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sh", "-c",
		`i=0; while true; do i=$((i+1)); echo "$$ $i" > counter.new; mv counter.new counter; sleep 0.05; done`}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c.client(), v.ID, events.PhaseReady)
	counter := filepath.Join(dir, "process", v.ID, "work", "counter")
	pid, n := readCounter(t, counter, 1)
	// Another ends when told to, while the service is down.
	quits, err := c.client().Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sh", "-c",
		`while [ ! -e quit ]; do sleep 0.02; done; exit 3`}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c.client(), quits.ID, events.PhaseReady)

	// ^C, as a terminal sends it: to the whole process group of the service.
	if err := syscall.Kill(-c.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-c.done
	if p, _ := readCounter(t, counter, n+5); p != pid {
		t.Fatalf("without the service the counter is written by %d, not %d", p, pid)
	}
	if err := os.WriteFile(filepath.Join(dir, "process", quits.ID, "work", "quit"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the exit recorded", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "process", quits.ID, "run.json"))
		return strings.Contains(string(b), `"exited":true`)
	})

	c = serveProcess(t, dir, "--nats-listen", natsListen)
	cl := c.client()
	if got, err := cl.Get(ctx, v.ID); err != nil || got.Phase != events.PhaseReady || got.Generation != 1 {
		t.Fatalf("after the restart: %+v, %v", got, err)
	}
	// The exit its supervisor kept asking to report is taken now.
	if got := mustWait(t, cl, quits.ID, events.PhaseError); got.ExitCode == nil || *got.ExitCode != 3 || got.Reason != events.ReasonMainProcessExited {
		t.Fatalf("the sandbox that exited meanwhile: %+v", got)
	}
	lifecycle := func(verb string, want events.Phase) events.View {
		t.Helper()
		acc, err := cl.Lifecycle(ctx, verb, v.ID, false, "")
		if err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
		got, err := cl.WaitAfter(ctx, v.ID, want, acc.Seq, waitFor)
		if err != nil {
			t.Fatalf("%s: wait for %s: %v (%+v)", verb, want, err, got)
		}
		return got
	}
	if got := lifecycle("suspend", events.PhaseSuspended); !got.Restore.Held {
		t.Fatalf("suspended: %+v", got)
	}
	_, at := readCounter(t, counter, 0)
	if got := lifecycle("resume", events.PhaseReady); got.Generation != 2 || got.LastOutcome != events.OutcomeRestored {
		t.Fatalf("resumed: %+v", got)
	}
	if p, _ := readCounter(t, counter, at+1); p != pid {
		t.Fatalf("resumed, the counter is written by %d, not %d", p, pid)
	}
	lifecycle("stop", events.PhaseStopped)
	if got := lifecycle("start", events.PhaseReady); got.Generation != 3 {
		t.Fatalf("started: %+v", got)
	}
	eventually(t, "a fresh counter", func() bool {
		p, _ := readCounter(t, counter, 0)
		return p != pid
	})

	acc, err := cl.Delete(ctx, v.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.WaitAfter(ctx, v.ID, events.PhaseDeleted, acc.Seq, waitFor); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "process", v.ID)); !os.IsNotExist(err) {
		t.Errorf("the sandbox's directory is left: %v", err)
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/torpor-" + v.ID); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	converged(t, c, dir, v.ID, events.PhaseDeleted)
}

// readCounter waits until the counter file holds a count of at least min
// and returns the pid and count in it.
func readCounter(t *testing.T, path string, min int) (pid, n int) {
	t.Helper()
	eventually(t, "the counter at "+strconv.Itoa(min), func() bool {
		b, err := os.ReadFile(path)
		f := strings.Fields(string(b))
		if err != nil || len(f) != 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[0])
		n, _ = strconv.Atoi(f[1])
		return n >= min
	})
	return pid, n
}

// eventually waits until cond holds, polling: for files a workload writes,
// which tell of no change any other way.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// deleteProcessSandboxes deletes, with a process driver of its own, every
// process sandbox left under dir: a test that failed half way leaves no
// process and no cgroup behind.
func deleteProcessSandboxes(t *testing.T, dir string) {
	d, err := process.New(process.Config{Data: dir, NATSURL: "nats://127.0.0.1:1"})
	if err != nil {
		t.Error(err)
		return
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "process"))
	for _, e := range entries {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "process", e.Name(), "supervisor.log"))
			t.Logf("supervisor.log of %s:\n%s", e.Name(), b)
		}
		if err := d.Delete(context.Background(), compute.Spec{SandboxID: e.Name()}); err != nil {
			t.Errorf("delete %s: %v", e.Name(), err)
		}
	}
}
