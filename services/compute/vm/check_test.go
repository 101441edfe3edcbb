package vm_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/vm"
)

// TestTargetRefusesBeforeConsuming (issue 29): a suspend records what its
// snapshot needs; a node short of memory for it refuses the moved
// snapshot, FAILED_PRECONDITION saying so, and nothing is consumed: the
// snapshot then restores on its own node.
func TestTargetRefusesBeforeConsuming(t *testing.T) {
	g := drivertest.NewGateway(t)
	n1, _ := newDriver(t, g, nil)
	n2, _ := newDriver(t, g, nil)
	s := spec("n1", counter...)
	start(t, n1, g, s, 1)
	ref, err := n1.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if machine, qemu, memory := vm.SnapshotNeeds(t, n1, s.SandboxID); machine != "microvm" || qemu == "" || memory != vm.DefaultMemory {
		t.Fatalf("the snapshot needs machine %q, QEMU %q, %d MiB; want microvm, a version, %d MiB", machine, qemu, memory, vm.DefaultMemory)
	}
	if err := n1.CanRestore(ctx(t), s, ref); err != nil {
		t.Fatalf("its own node: %v", err)
	}
	moved, err := n1.Export(ctx(t), s, ref)
	if err != nil {
		t.Fatal(err)
	}
	s2 := s
	s2.Node = "n2"
	if err := n2.CanRestore(ctx(t), s2, moved); err != nil {
		t.Fatalf("n2 with room: %v", err)
	}
	vm.SetMeminfo(t, 100)
	err = n2.CanRestore(ctx(t), s2, moved)
	if !errors.Is(err, compute.ErrRejected) || events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "128 MiB is more than the node's free memory (100 MiB") {
		t.Fatalf("n2 short of memory: %v (%s), want a refusal saying so", err, events.CodeOf(err))
	}
	if o, _ := n1.Observe(ctx(t), s); o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("n1 observes %+v after the refusal, want frozen behind %s", o, ref)
	}
	res, err := n1.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: ref})
	if err != nil || !res.Consumed {
		t.Fatalf("resume on n1 after the refusal: %+v, %v", res, err)
	}
	g.Await(t, s.SandboxID, compute.ReportAttached, 2)
}
