package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute/process"
)

// Process is the process driver's section: the freeze and the thaw of a
// process group with each freezer this machine has, and suspend→suspended
// and resume→ready of process sandboxes through the whole pipeline (the
// HTTP command, the saga, the driver's freeze or thaw, the supervisor's
// attach, the KV view, the SDK's wait).
type Process struct {
	Freezers []FreezerRow `json:"freezers"`
	// Sandboxes sandboxes (a shell running sleep in a loop) were each
	// suspended and resumed Rounds times, one command at a time.
	Sandboxes int         `json:"sandboxes"`
	Rounds    int         `json:"rounds"`
	Suspend   Percentiles `json:"suspend_to_suspended_ms"`
	Resume    Percentiles `json:"resume_to_ready_ms"`
}

// FreezerRow is one freezer's freeze and thaw of a process group, in ms.
type FreezerRow struct {
	Freezer string      `json:"freezer"`
	Cycles  int         `json:"cycles"`
	Freeze  Percentiles `json:"freeze_ms"`
	Thaw    Percentiles `json:"thaw_ms"`
	// Missing says why the freezer could not be measured here.
	Missing string `json:"missing,omitempty"`
}

// Percentiles of a set of durations, in milliseconds.
type Percentiles struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50"`
	P90     float64 `json:"p90"`
	P99     float64 `json:"p99"`
	Max     float64 `json:"max"`
}

func percentilesOf(ds []time.Duration) Percentiles {
	p := Percentiles{Samples: len(ds)}
	p.P50, p.P90, p.P99, p.Max = percentiles(ds)
	return p
}

// processCommand is the workload of the pipeline's process sandboxes.
var processCommand = []string{"sh", "-c", "while :; do sleep 0.05; done"}

// RunProcess measures the process section: the freezers directly, then a
// fresh service (fsync interval) whose process sandboxes it suspends and
// resumes. The sandboxes are deleted before the service stops (a stopped
// service leaves process sandboxes running).
func RunProcess(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*Process, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cycles, sandboxes, rounds := 3000, 4, 50
	if cfg.Quick {
		cycles, rounds = 300, 10
	}
	p := &Process{Sandboxes: sandboxes, Rounds: rounds}
	for _, kind := range process.Freezers() {
		fmt.Fprintf(progress, "bench: process: %d freezes and thaws (%s)\n", cycles, kind)
		row := FreezerRow{Freezer: kind}
		if err := process.Available(kind); err != nil {
			row.Missing = err.Error()
			p.Freezers = append(p.Freezers, row)
			continue
		}
		freeze, thaw, err := process.MeasureFreezer(ctx, kind, cycles)
		if err != nil {
			return nil, err
		}
		row.Cycles, row.Freeze, row.Thaw = cycles, percentilesOf(freeze), percentilesOf(thaw)
		p.Freezers = append(p.Freezers, row)
	}

	dir, err := os.MkdirTemp("", "torpor-bench-process-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	svc, err := start(ctx, dir, "interval")
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.Stop() }()
	c := httpClient(svc.HTTPAddr(), 1)
	var ids []string
	defer func() {
		// Every sandbox made, whatever happened: none outlives the bench.
		for _, id := range ids {
			if acc, err := c.Delete(context.WithoutCancel(ctx), id, ""); err == nil {
				_, _ = c.WaitAfter(context.WithoutCancel(ctx), id, events.PhaseDeleted, acc.Seq, 30*time.Second)
			}
		}
	}()
	for range sandboxes {
		v, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: processCommand}, "")
		if err != nil {
			return nil, fmt.Errorf("process: create: %w", err)
		}
		ids = append(ids, v.ID)
		if v, err := c.Wait(ctx, v.ID, events.PhaseReady, 30*time.Second); err != nil || v.Phase != events.PhaseReady {
			return nil, fmt.Errorf("process: sandbox %s not ready: %+v %w", v.ID, v, err)
		}
	}
	fmt.Fprintf(progress, "bench: process: %d sandboxes suspended and resumed %d times each through the pipeline\n", sandboxes, rounds)
	step := waitStep(c)
	var suspends, resumes []time.Duration
	for range rounds {
		for _, id := range ids {
			t0 := time.Now()
			if err := step(ctx, "suspend", id, events.PhaseSuspended); err != nil {
				return nil, fmt.Errorf("process: %w", err)
			}
			t1 := time.Now()
			if err := step(ctx, "resume", id, events.PhaseReady); err != nil {
				return nil, fmt.Errorf("process: %w", err)
			}
			suspends, resumes = append(suspends, t1.Sub(t0)), append(resumes, time.Since(t1))
		}
	}
	p.Suspend, p.Resume = percentilesOf(suspends), percentilesOf(resumes)
	return p, nil
}
