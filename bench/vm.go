package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
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
	// Moves resumes went to another node (to MoveNode and back, turn about);
	// Move is each one's resume→ready: the fetch from torpor_snapshots and
	// the restore on the other node (the snapshot was exported ahead).
	Moves    int         `json:"moves"`
	MoveNode string      `json:"move_node,omitempty"`
	Move     Percentiles `json:"move_resume_to_ready_ms"`
	// ResumeStages and MoveStages are the same-node resumes' and the
	// moves' latency by stage (README "Resume latency"), from the command
	// accepted.
	ResumeStages []StageRow `json:"resume_stages,omitempty"`
	MoveStages   []StageRow `json:"move_resume_stages,omitempty"`
	// ExportAhead is each move's suspended→movable: the snapshot exported
	// to torpor_snapshots in the background after the suspension (a node
	// with peers), waited for before the resume is sent and not counted in
	// Move.
	ExportAhead Percentiles `json:"export_ahead_ms"`
	// The p50s of each run (--runs) of the rounds and of the moves: the
	// samples split in as many blocks, in the order they ran.
	SuspendP50Runs []float64 `json:"suspend_p50_ms_runs,omitempty"`
	ResumeP50Runs  []float64 `json:"resume_p50_ms_runs,omitempty"`
	MoveP50Runs    []float64 `json:"move_p50_ms_runs,omitempty"`
	// StateBytes is the device state a same-node snapshot writes (the RAM
	// stays in the node's RAM file); MovableBytes the object a move to
	// another node puts in torpor_snapshots, for MemoryMiB of guest memory.
	StateBytes   int64 `json:"state_bytes"`
	MovableBytes int64 `json:"movable_bytes"`
	MemoryMiB    int   `json:"memory_mib"`
	// Missing says why the section could not run here.
	Missing string `json:"missing,omitempty"`
	// AccelWhy is why the rows ran under Accel (the vm driver's KVM
	// probe: booted, or did not within its bound and fell back to TCG).
	AccelWhy string `json:"accel_why,omitempty"`
}

// vmCommand is the workload of the bench's VM sandboxes.
var vmCommand = []string{"sh", "-c", "while :; do sleep 0.05; done"}

// vmOther is the node the bench's VM sandboxes move to and back from: a
// `torpor driver --node` beside the service (Starter), with a data
// directory of its own, on the service's NATS.
const vmOther = "bench-n2"

// vmProbe is a vm driver on dir that starts nothing, to ask it what it
// lacks (missing, "" when it has all it needs) and which accelerator it
// would use.
func vmProbe(dir string) (probe *vm.Driver, missing string, err error) {
	probe, err = vm.New(vm.Config{Data: dir, NATSURL: "nats://127.0.0.1:1"})
	if err != nil {
		return nil, "", err
	}
	if err := probe.Missing(); err != nil {
		return probe, err.Error(), nil
	}
	return probe, "", nil
}

// RunVM measures the VM section on a fresh service (fsync interval) that
// drives a second node (vmOther), so that every call goes through
// compute.Routed, as on any service with --remote-nodes. The sandboxes are
// deleted before the service stops.
func RunVM(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*VM, error) {
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, err
	}
	sandboxes, rounds, moves := 2, 10, 4
	if cfg.Quick {
		sandboxes, rounds, moves = 1, 3, 2
	}
	r := &VM{Sandboxes: sandboxes, Rounds: rounds, MemoryMiB: vm.DefaultMemory, MoveNode: vmOther}
	dir, err := os.MkdirTemp("", "torpor-bench-vm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	probe, missing, err := vmProbe(dir)
	if err != nil || missing != "" {
		r.Missing = missing
		return r, err
	}
	r.Accel, r.AccelWhy = probe.Accelerator(ctx)
	svc, err := start(ctx, dir, "interval", vmOther)
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.Stop() }()
	c := httpClient(svc, 1)
	var ids []string
	defer func() { deleteAll(ctx, c, ids) }()
	fmt.Fprintf(progress, "bench: vm: %d microVMs booted (%s), suspended and resumed %d times each through the pipeline\n", sandboxes, r.Accel, rounds)
	// A boot under emulation takes seconds, more on a busy machine.
	boots, err := createEach(ctx, c, torpor.CreateRequest{Driver: "vm", Command: vmCommand}, sandboxes, 3*time.Minute, &ids)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	r.Boot = percentilesOf(boots)
	stages, moveStages := stageSamples{}, stageSamples{}
	lats, err := suspendResumeRounds(ctx, c, ids, rounds, stages)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	r.SuspendP50Runs, r.ResumeP50Runs = blockP50s(lats[0], max(1, cfg.Runs)), blockP50s(lats[1], max(1, cfg.Runs))
	r.Suspend, r.Resume = percentilesOf(lats[0]), percentilesOf(lats[1])
	fmt.Fprintf(progress, "bench: vm: each moved to %s and back, %d resumes on the other node\n", vmOther, moves)
	movable, closeStore, err := movableIn(svc)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	defer closeStore()
	moved, ahead, err := moveRounds(ctx, c, ids, moves, moveStages, movable)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	r.ResumeStages, r.MoveStages = stages.rows(), moveStages.rows()
	r.MoveP50Runs = blockP50s(moved, max(1, cfg.Runs))
	r.Moves, r.Move, r.ExportAhead = len(moved), percentilesOf(moved), percentilesOf(ahead)
	if err := r.snapshotBytes(ctx, svc, c, dir, ids[0], movable); err != nil {
		return nil, fmt.Errorf("vm: snapshot bytes: %w", err)
	}
	return r, nil
}

// moveRounds suspends each of ids and resumes it on the other node, moves
// times each (to vmOther, then back to the service's own, and so on), and
// gives each resume's time to ready, its stages to stages, and each
// suspension's to movable (its snapshot whole in torpor_snapshots, exported
// ahead), waited for before the resume. Each sandbox ends on the node it
// began on when moves is even.
func moveRounds(ctx context.Context, c *torpor.Client, ids []string, moves int, stages stageSamples, movable func(context.Context, string) error) (lats, ahead []time.Duration, err error) {
	step := waitStep(c)
	nodes := [2]string{vmOther, "local"}
	for i := range moves {
		for _, id := range ids {
			if err := step(ctx, "suspend", id, events.PhaseSuspended); err != nil {
				return nil, nil, fmt.Errorf("%w (the sandbox's last event: %s)", err, lastEvent(ctx, c, id))
			}
			t := time.Now()
			if err := movable(ctx, id); err != nil {
				return nil, nil, fmt.Errorf("%s: the snapshot exported ahead: %w", id, err)
			}
			ahead = append(ahead, time.Since(t))
			t0 := time.Now()
			acc, err := c.Resume(ctx, id, torpor.ResumeOptions{Node: nodes[i%2]}, "")
			if err != nil {
				return nil, nil, fmt.Errorf("resume %s --node %s: %w", id, nodes[i%2], err)
			}
			v, err := c.WaitAfter(ctx, id, events.PhaseReady, acc.Seq, time.Minute)
			if err != nil || v.Node != nodes[i%2] {
				return nil, nil, fmt.Errorf("resume %s --node %s: %v, the view %+v (the sandbox's last event: %s)", id, nodes[i%2], err, v, lastEvent(ctx, c, id))
			}
			lats = append(lats, time.Since(t0))
			if err := stages.add(ctx, c, id); err != nil {
				return nil, nil, err
			}
		}
	}
	return lats, ahead, nil
}

// movableIn is what waits, on svc's torpor_snapshots, until a sandbox's
// snapshot is there whole (the store lists an object only once its last
// chunk is in): a move's resume then only fetches it.
func movableIn(svc Service) (func(context.Context, string) error, func(), error) {
	nc, err := nats.Connect(svc.NATSURL(), svc.NATSOptions()...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	store, err := js.ObjectStore(context.Background(), vm.SnapshotBucket)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	movable := func(ctx context.Context, id string) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for {
			infos, err := store.List(ctx)
			if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
				return err
			}
			for _, info := range infos {
				if strings.HasPrefix(info.Name, id+"/") {
					return nil
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	return movable, nc.Close, nil
}

// snapshotBytes suspends sandbox id once more and reads what its snapshot
// keeps: the device state file on the node, and the object its export
// ahead puts in the store (the sandbox is resumed after, on its node, from
// the same snapshot).
func (r *VM) snapshotBytes(ctx context.Context, svc Service, c *torpor.Client, dir, id string, movable func(context.Context, string) error) error {
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
	nc, err := nats.Connect(svc.NATSURL(), svc.NATSOptions()...)
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
	if err := movable(ctx, id); err != nil { // exported ahead by the service
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
