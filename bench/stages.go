package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
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
// from the command accepted (events.ResumeStages).
func resumeStages(h []events.HistoryEntry) (map[string]time.Duration, error) {
	_, st, err := events.ResumeStages(h)
	return st, err
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
	for _, stage := range events.ResumeStageNames {
		row := StageRow{Stage: stage}
		switch ds := s[stage]; {
		case len(ds) > 0:
			row.Latency = percentilesOf(ds)
		case stage == events.StageLoaded:
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
