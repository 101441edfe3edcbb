package vm_test

import (
	"strings"
	"syscall"
	"testing"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/vm"
)

// TestSpareSupervisor: after a start, a supervisor waits ahead for the
// next restore, with no credential on its command line; a resume hands it
// its job, and the restored guest runs under it. A spare that died before
// its job is no failure: the resume starts a supervisor afresh. Close lets
// the spare go.
func TestSpareSupervisor(t *testing.T) {
	g := drivertest.NewGateway(t)
	d, _ := newDriver(t, g, nil)
	s := spec("n1", counter...)
	start(t, d, g, s, 1)
	var spare int
	eventually(t, "a spare supervisor after the start", func() bool { spare = vm.Spare(d); return spare > 0 })
	if cmd := drivertest.Cmdline(spare); !strings.Contains(cmd, "--job-fd") || strings.Contains(cmd, drivertest.Cred(1)) || strings.Contains(cmd, s.SandboxID) {
		t.Fatalf("the spare's command line %q: want --job-fd, and neither a credential nor a sandbox", cmd)
	}
	at := lastCount(t, d, s)
	gen := int64(1)
	cycle := func() {
		t.Helper()
		ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: gen})
		if err != nil {
			t.Fatal(err)
		}
		gen++
		if res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: gen, Credential: drivertest.Cred(gen), RestoreRef: ref}); err != nil || !res.Consumed {
			t.Fatalf("resume generation %d: %+v, %v", gen, res, err)
		}
		g.Await(t, s.SandboxID, compute.ReportAttached, gen)
	}
	cycle()
	if got := vm.Supervisor(d, s); got != spare {
		t.Fatalf("generation 2's supervisor is %d, want the spare %d", got, spare)
	}
	eventually(t, "the guest counts on under the spare", func() bool { return lastCount(t, d, s) > at+2 })

	// The next spare dies before its job: the resume starts its own.
	eventually(t, "another spare after the resume", func() bool { spare = vm.Spare(d); return spare > 0 })
	if err := syscall.Kill(spare, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the spare is gone", func() bool { return drivertest.Cmdline(spare) == "" })
	at = lastCount(t, d, s)
	cycle()
	if got := vm.Supervisor(d, s); got == spare || got == 0 {
		t.Fatalf("generation 3's supervisor is %d, want one started afresh (the spare %d was dead)", got, spare)
	}
	eventually(t, "the guest counts on under a fresh supervisor", func() bool { return lastCount(t, d, s) > at+2 })

	eventually(t, "a spare again", func() bool { spare = vm.Spare(d); return spare > 0 })
	d.Close()
	eventually(t, "the spare ends once let go", func() bool { return drivertest.Cmdline(spare) == "" })
}
