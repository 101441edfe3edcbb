package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/vm"
)

// VM is the vm driver's section: microVM sandboxes (128 MiB, the default)
// booted, suspended and resumed through the whole pipeline (HTTP command,
// saga, QMP, the new supervisor's attach, the KV view, the SDK's wait),
// and the bytes a snapshot keeps on the node and in the object store.
type VM struct {
	Accel     string      `json:"accel"`
	Sandboxes int         `json:"sandboxes"`
	Rounds    int         `json:"rounds"`
	Boot      Percentiles `json:"boot_to_ready_ms"`
	Suspend   Percentiles `json:"suspend_to_suspended_ms"`
	Resume    Percentiles `json:"resume_to_ready_ms"`
	// StateBytes is the device state a same-node snapshot writes (the RAM
	// stays in the node's RAM file); MovableBytes the object a move to
	// another node puts in torpor_snapshots, for MemoryMiB of guest memory.
	StateBytes   int64 `json:"state_bytes"`
	MovableBytes int64 `json:"movable_bytes"`
	MemoryMiB    int   `json:"memory_mib"`
	// Missing says why the section could not run here.
	Missing string `json:"missing,omitempty"`
}

// vmCommand is the workload of the bench's VM sandboxes.
var vmCommand = []string{"sh", "-c", "while :; do sleep 0.05; done"}

// RunVM measures the VM section on a fresh service (fsync interval). The
// sandboxes are deleted before the service stops.
func RunVM(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*VM, error) {
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, err
	}
	sandboxes, rounds := 2, 10
	if cfg.Quick {
		sandboxes, rounds = 1, 3
	}
	r := &VM{Sandboxes: sandboxes, Rounds: rounds, MemoryMiB: vm.DefaultMemory}
	dir, err := os.MkdirTemp("", "torpor-bench-vm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	probe, err := vm.New(vm.Config{Data: dir, NATSURL: "nats://127.0.0.1:1"})
	if err != nil {
		return nil, err
	}
	if err := probe.Missing(); err != nil {
		r.Missing = err.Error()
		return r, nil
	}
	r.Accel, _ = probe.Accelerator(ctx)
	svc, err := start(ctx, dir, "interval")
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.Stop() }()
	c := httpClient(svc.HTTPAddr(), 1)
	var ids []string
	defer func() { deleteAll(ctx, c, ids) }()
	fmt.Fprintf(progress, "bench: vm: %d microVMs booted (%s), suspended and resumed %d times each through the pipeline\n", sandboxes, r.Accel, rounds)
	// A boot under emulation takes seconds, more on a busy machine.
	boots, err := createEach(ctx, c, torpor.CreateRequest{Driver: "vm", Command: vmCommand}, sandboxes, 3*time.Minute, &ids)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	r.Boot = percentilesOf(boots)
	lats, err := suspendResumeRounds(ctx, c, ids, rounds)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	r.Suspend, r.Resume = percentilesOf(lats[0]), percentilesOf(lats[1])
	if err := r.snapshotBytes(ctx, svc, c, dir, ids[0]); err != nil {
		return nil, fmt.Errorf("vm: snapshot bytes: %w", err)
	}
	return r, nil
}

// snapshotBytes suspends sandbox id once more and reads what its snapshot
// keeps: the device state file on the node, and the object an export to the
// store makes (by a driver of its own on the service's data and NATS; the
// sandbox is resumed after, on its node, from the same snapshot).
func (r *VM) snapshotBytes(ctx context.Context, svc Service, c *torpor.Client, dir, id string) error {
	if _, err := c.Lifecycle(ctx, "suspend", id, false, ""); err != nil {
		return err
	}
	if _, err := c.Wait(ctx, id, events.PhaseSuspended, 30*time.Second); err != nil {
		return err
	}
	states, _ := filepath.Glob(filepath.Join(dir, "vm", id, "snap-*.state"))
	for _, s := range states {
		if fi, err := os.Stat(s); err == nil {
			r.StateBytes = fi.Size()
		}
	}
	nc, err := nats.Connect(svc.NATSURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	store, err := js.ObjectStore(ctx, vm.SnapshotBucket)
	if err != nil {
		return err
	}
	d, err := vm.New(vm.Config{Data: dir, NATSURL: svc.NATSURL(), Snapshots: store})
	if err != nil {
		return err
	}
	spec := compute.Spec{SandboxID: id, Node: "local"}
	o, err := d.Observe(ctx, spec)
	if err != nil {
		return err
	}
	_, err = d.Export(ctx, spec, o.RestoreRef)
	if err != nil {
		return err
	}
	infos, err := store.List(ctx)
	if err != nil {
		return err
	}
	for _, info := range infos {
		r.MovableBytes += int64(info.Size)
	}
	if _, err := c.Resume(ctx, id, torpor.ResumeOptions{}, ""); err != nil {
		return err
	}
	_, err = c.Wait(ctx, id, events.PhaseReady, 30*time.Second)
	return err
}
