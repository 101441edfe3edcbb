package process_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
)

// TestReportsAskedAgainOnAFailure: an attach answered UNAVAILABLE and an
// exit answered ABORTED (a gateway whose append failed once) are sent
// again until taken, in order, and taken once each; the supervisor took
// any answer for an answer and dropped them.
func TestReportsAskedAgainOnAFailure(t *testing.T) {
	g := newGateway(t)
	d, _ := newDriver(t, g, nil)
	g.FailOnce(compute.ReportAttached, events.CodeUnavailable)
	g.FailOnce(compute.ReportExited, events.CodeAborted)
	spec := newSpec("sh", "-c", "while [ ! -e done ]; do sleep 0.02; done; exit 3")
	startReady(t, d, g, spec, 1)
	if err := os.WriteFile(filepath.Join(process.Dir(d, spec.SandboxID), "work", "done"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := g.Await(t, spec.SandboxID, compute.ReportExited, 1); r.ExitCode != 3 {
		t.Fatalf("exit code %d, want 3", r.ExitCode)
	}
	eventually(t, "the supervisor gone", func() bool {
		sup, _ := process.Pids(d, spec.SandboxID)
		return !alive(sup)
	})
	n := map[string]int{}
	for _, r := range g.Sent(spec.SandboxID) {
		n[r.Kind]++
	}
	if n[compute.ReportAttached] != 2 || n[compute.ReportExited] != 2 {
		t.Fatalf("sent %v: want the attach and the exit twice each (refused once, then taken)", n)
	}
}

// TestAttachesAgainAfterADetach: a supervisor whose heartbeats are refused
// as not attached (recorded detached after a silence) sends its attach
// again, and beats on once it is taken.
func TestAttachesAgainAfterADetach(t *testing.T) {
	g := newGateway(t)
	d, _ := newDriver(t, g, nil)
	spec := newSpec("sleep", "3600")
	startReady(t, d, g, spec, 1)
	g.Detach(spec.SandboxID)
	g.Await(t, spec.SandboxID, compute.ReportAttached, 1)
	g.Await(t, spec.SandboxID, compute.ReportHeartbeat, 1)
	observe(t, d, spec, compute.StateRunning, 1)
}

// TestHeartbeatsSayBusy: with every freezer (the group's processes are
// found its way: a cgroup's, or the process group's), the heartbeats of a
// workload that spins on a CPU say it was active, and those of one that
// sleeps never do (README "Activity": the CPU time of the group advanced by
// more than a fiftieth of the interval since the beat before).
func TestHeartbeatsSayBusy(t *testing.T) {
	for _, kind := range process.Freezers() {
		t.Run(kind, func(t *testing.T) {
			needFreezer(t, kind)
			g := newGateway(t)
			d, _ := newDriver(t, g, func(c *process.Config) { c.Freezer = kind })
			// The spinning child is the shell's, as a workload's children are.
			busy, idle := newSpec("sh", "-c", "sh -c 'while :; do :; done' & wait"), newSpec("sleep", "3600")
			startReady(t, d, g, busy, 1)
			startReady(t, d, g, idle, 1)
			beats := func(id string) (n, active int) {
				for _, r := range g.Sent(id) {
					if r.Kind == compute.ReportHeartbeat {
						n++
						if r.Active {
							active++
						}
					}
				}
				return n, active
			}
			eventually(t, "busy beats of the spinning workload", func() bool { _, a := beats(busy.SandboxID); return a >= 3 })
			eventually(t, "ten beats of the sleeping workload", func() bool { n, _ := beats(idle.SandboxID); return n >= 10 })
			if n, a := beats(idle.SandboxID); a != 0 {
				t.Fatalf("the sleeping workload: %d of %d beats say active, want none", a, n)
			}
		})
	}
}
