package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
	torpor "github.com/torpor/torpor/sdk/go"
)

// StageRow is one stage of resume latency over a bench's resumes (README
// "Resume latency"): from the resume command accepted (the time of its
// sandbox.resume_requested) to restore_started, running, ready or loaded,
// read from each resumed sandbox's history: the same times
// torpor_resume_latency_seconds observes.
type StageRow struct {
	Stage   string      `json:"stage"`
	Latency Percentiles `json:"latency_ms"`
	// Missing says why the stage has no figures: "not lazy here" for
	// loaded, where the restore is whole when the guest runs.
	Missing string `json:"missing,omitempty"`
}

// notLazy is the Missing of the loaded stage of a restore that is whole
// when the workload runs again.
const notLazy = "not lazy here"

// resumeStages reads the newest resume in history h: each stage's time
// from the command accepted, for the stages h holds (ready: the attach of
// the resumed generation; restore_started, running, loaded: the times
// sandbox.resumed carries).
func resumeStages(h []events.HistoryEntry) (map[string]time.Duration, error) {
	at := -1
	for i, e := range h {
		if e.Type == events.TypeResumeRequested {
			at = i
		}
	}
	if at < 0 {
		return nil, fmt.Errorf("no %s in the history", events.TypeResumeRequested)
	}
	accepted := h[at].Time
	var req events.ResumeRequested
	if err := json.Unmarshal(h[at].Data, &req); err != nil {
		return nil, fmt.Errorf("%s: %w", events.TypeResumeRequested, err)
	}
	out := map[string]time.Duration{}
	for _, e := range h[at+1:] {
		switch e.Type {
		case events.TypeResumed:
			var r events.Resumed
			if err := json.Unmarshal(e.Data, &r); err != nil {
				return nil, fmt.Errorf("%s: %w", events.TypeResumed, err)
			}
			for stage, t := range map[string]time.Time{metrics.StageRestoreStarted: r.RestoreStartedAt, metrics.StageRunning: r.RunningAt, metrics.StageLoaded: r.LoadedAt} {
				if !t.IsZero() {
					out[stage] = t.Sub(accepted)
				}
			}
		case events.TypeSupervisorAttached:
			var a events.SupervisorAttached
			if err := json.Unmarshal(e.Data, &a); err != nil {
				return nil, fmt.Errorf("%s: %w", events.TypeSupervisorAttached, err)
			}
			if _, ok := out[metrics.StageReady]; !ok && a.Generation == req.Generation {
				out[metrics.StageReady] = e.Time.Sub(accepted)
			}
		}
	}
	return out, nil
}

// stageSamples are the stages of many resumes, by stage.
type stageSamples map[string][]time.Duration

// add reads the stages of sandbox id's newest resume.
func (s stageSamples) add(ctx context.Context, c *torpor.Client, id string) error {
	h, err := c.History(ctx, id, 0)
	if err != nil {
		return fmt.Errorf("history of %s: %w", id, err)
	}
	st, err := resumeStages(h)
	if err != nil {
		return fmt.Errorf("resume stages of %s: %w", id, err)
	}
	for stage, d := range st {
		s[stage] = append(s[stage], d)
	}
	return nil
}

// rows are s's stages in their order, each with its percentiles or why it
// has none.
func (s stageSamples) rows() []StageRow {
	var out []StageRow
	for _, stage := range metrics.ResumeStages {
		row := StageRow{Stage: stage}
		switch ds := s[stage]; {
		case len(ds) > 0:
			row.Latency = percentilesOf(ds)
		case stage == metrics.StageLoaded:
			row.Missing = notLazy
		default:
			row.Missing = "the driver does not say"
		}
		out = append(out, row)
	}
	return out
}

// stageLine is one line of the report: rows after what, each stage's p50,
// p90 and max, or why it has none.
func stageLine(what string, rows []StageRow) string {
	line := what + ", from the command accepted (README \"Resume latency\"):"
	for i, r := range rows {
		if i > 0 {
			line += ";"
		}
		if r.Missing != "" {
			line += fmt.Sprintf(" →%s: %s", r.Stage, r.Missing)
			continue
		}
		line += fmt.Sprintf(" →%s p50 %.2f p90 %.2f max %.2f ms", r.Stage, r.Latency.P50, r.Latency.P90, r.Latency.Max)
	}
	return line
}
