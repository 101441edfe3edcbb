package events

import (
	"encoding/json"
	"fmt"
	"time"
)

// Stages of a resume's latency (README "Resume latency"), each measured
// from the resume command accepted, the time of its
// sandbox.resume_requested: the driver began the restore, the workload
// runs again, the resumed generation's supervisor attached (ready), a lazy
// restore's memory is all loaded. torpor_resume_latency_seconds names them
// the same (internal/metrics).
const (
	StageRestoreStarted = "restore_started"
	StageRunning        = "running"
	StageReady          = "ready"
	StageLoaded         = "loaded"
)

// ResumeStageNames are the stages in their order.
var ResumeStageNames = []string{StageRestoreStarted, StageRunning, StageReady, StageLoaded}

// ResumeStages reads the newest resume in history h: the generation it
// minted and each stage's time from the command accepted, for the stages h
// holds (ready: the attach of that generation; restore_started, running,
// loaded: the times its sandbox.resumed carries). The bench and torpor top
// read resume latency with it.
func ResumeStages(h []HistoryEntry) (int64, map[string]time.Duration, error) {
	at := -1
	for i, e := range h {
		if e.Type == TypeResumeRequested {
			at = i
		}
	}
	if at < 0 {
		return 0, nil, fmt.Errorf("no %s in the history", TypeResumeRequested)
	}
	accepted := h[at].Time
	var req ResumeRequested
	if err := json.Unmarshal(h[at].Data, &req); err != nil {
		return 0, nil, fmt.Errorf("%s: %w", TypeResumeRequested, err)
	}
	out := map[string]time.Duration{}
	for _, e := range h[at+1:] {
		switch e.Type {
		case TypeResumed:
			var r Resumed
			if err := json.Unmarshal(e.Data, &r); err != nil {
				return 0, nil, fmt.Errorf("%s: %w", TypeResumed, err)
			}
			if r.Generation != req.Generation || r.Outcome != OutcomeRestored {
				continue
			}
			for stage, t := range map[string]time.Time{StageRestoreStarted: r.RestoreStartedAt, StageRunning: r.RunningAt, StageLoaded: r.LoadedAt} {
				if !t.IsZero() {
					out[stage] = t.Sub(accepted)
				}
			}
		case TypeSupervisorAttached:
			var a SupervisorAttached
			if err := json.Unmarshal(e.Data, &a); err != nil {
				return 0, nil, fmt.Errorf("%s: %w", TypeSupervisorAttached, err)
			}
			if _, ok := out[StageReady]; !ok && a.Generation == req.Generation {
				out[StageReady] = e.Time.Sub(accepted)
			}
		}
	}
	return req.Generation, out, nil
}
