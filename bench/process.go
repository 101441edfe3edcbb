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
	// ResumeStages are the resumes' latency by stage (README "Resume
	// latency"), from the command accepted.
	ResumeStages []StageRow `json:"resume_stages,omitempty"`
}

// FreezerRow is one freezer's freeze and thaw of a process group, in ms.
type FreezerRow struct {
	Freezer string      `json:"freezer"`
	Cycles  int         `json:"cycles"`
	Freeze  Percentiles `json:"freeze_ms"`
	Thaw    Percentiles `json:"thaw_ms"`
	// FreezeP99Runs and ThawP99Runs are the p99 of each run (--runs):
	// the cycles split in as many blocks, in the order they ran.
	FreezeP99Runs []float64 `json:"freeze_p99_ms_runs,omitempty"`
	ThawP99Runs   []float64 `json:"thaw_p99_ms_runs,omitempty"`
	// Missing says why the freezer could not be measured here.
	Missing string `json:"missing,omitempty"`
}

// processCommand is the workload of the pipeline's process sandboxes.
var processCommand = []string{"sh", "-c", "while :; do sleep 0.05; done"}

// RunProcess measures the process section: the freezers directly, then a
// fresh service (fsync interval) whose process sandboxes it suspends and
// resumes. The sandboxes are deleted before the service stops (a stopped
// service leaves process sandboxes running).
func RunProcess(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*Process, error) {
	cfg, err := cfg.resolved()
	if err != nil {
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
		row.FreezeP99Runs, row.ThawP99Runs = blockP99s(freeze, max(1, cfg.Runs)), blockP99s(thaw, max(1, cfg.Runs))
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
	c := httpClient(svc, 1)
	var ids []string
	defer func() { deleteAll(ctx, c, ids) }()
	_, err = createEach(ctx, c, torpor.CreateRequest{Driver: "process", Command: processCommand}, sandboxes, 30*time.Second, &ids)
	if err != nil {
		return nil, fmt.Errorf("process: %w", err)
	}
	fmt.Fprintf(progress, "bench: process: %d sandboxes suspended and resumed %d times each through the pipeline\n", sandboxes, rounds)
	stages := stageSamples{}
	lats, err := suspendResumeRounds(ctx, c, ids, rounds, stages)
	if err != nil {
		return nil, fmt.Errorf("process: %w", err)
	}
	p.Suspend, p.Resume = percentilesOf(lats[0]), percentilesOf(lats[1])
	p.ResumeStages = stages.rows()
	return p, nil
}

// deleteAll deletes the sandboxes ids, whatever happened before (none of
// the bench's outlives it), and waits for each to be deleted.
func deleteAll(ctx context.Context, c *torpor.Client, ids []string) {
	ctx = context.WithoutCancel(ctx)
	for _, id := range ids {
		if acc, err := c.Delete(ctx, id, ""); err == nil {
			_, _ = c.WaitAfter(ctx, id, events.PhaseDeleted, acc.Seq, 30*time.Second)
		}
	}
}

// createEach creates n sandboxes of r one at a time, each waited for until
// ready (at most wait), appending each id to *made as it is created (for
// the caller's cleanup), and returns each create→ready time.
func createEach(ctx context.Context, c *torpor.Client, r torpor.CreateRequest, n int, wait time.Duration, made *[]string) ([]time.Duration, error) {
	var took []time.Duration
	for range n {
		t0 := time.Now()
		v, err := c.Create(ctx, r, "")
		if err != nil {
			return took, fmt.Errorf("create: %w", err)
		}
		*made = append(*made, v.ID)
		ready, err := c.Wait(ctx, v.ID, events.PhaseReady, wait)
		switch {
		case err != nil:
			return took, fmt.Errorf("sandbox %s not ready: %w", v.ID, err)
		case ready.Phase != events.PhaseReady:
			return took, fmt.Errorf("sandbox %s not ready: %+v", v.ID, ready)
		}
		took = append(took, time.Since(t0))
	}
	return took, nil
}

// suspendResumeRounds suspends and resumes each of ids rounds times, one
// command at a time, each waited for through the pipeline, and returns the
// suspend→suspended and the resume→ready times; each resume's stages go
// to stages (read from the history after the resume's time is taken).
func suspendResumeRounds(ctx context.Context, c *torpor.Client, ids []string, rounds int, stages stageSamples) ([][]time.Duration, error) {
	step := waitStep(c)
	lats := make([][]time.Duration, len(suspendResume)) // by move
	for range rounds {
		for _, id := range ids {
			for i, mv := range suspendResume {
				t0 := time.Now()
				if err := step(ctx, mv.verb, id, mv.target); err != nil {
					return nil, fmt.Errorf("%w (the sandbox's last event: %s)", err, lastEvent(ctx, c, id))
				}
				lats[i] = append(lats[i], time.Since(t0))
				if mv.verb == "resume" {
					if err := stages.add(ctx, c, id); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	return lats, nil
}

// lastEvent is the newest event of sandbox id's history, its type and data,
// for an error that says why a step did not reach its phase.
func lastEvent(ctx context.Context, c *torpor.Client, id string) string {
	h, err := c.History(context.WithoutCancel(ctx), id, 0)
	if err != nil || len(h) == 0 {
		return fmt.Sprintf("none (%v)", err)
	}
	e := h[len(h)-1]
	return fmt.Sprintf("%s %s", e.Type, e.Data)
}
