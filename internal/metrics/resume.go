package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stages of a resume's latency (README "Resume latency"), each measured
// from the resume command accepted: the time of its
// sandbox.resume_requested.
const (
	// StageRestoreStarted: the driver began the restore
	// (sandbox.resumed's restore_started_at).
	StageRestoreStarted = "restore_started"
	// StageRunning: the guest runs again, vm: QEMU answered the cont
	// after the incoming snapshot; process: the thaw is done
	// (sandbox.resumed's running_at).
	StageRunning = "running"
	// StageReady: the resumed generation's supervisor attached (the time
	// of its supervisor.attached, which makes the sandbox ready).
	StageReady = "ready"
	// StageLoaded: a lazy restore's memory is all loaded
	// (sandbox.resumed's loaded_at); no driver restores lazily yet.
	StageLoaded = "loaded"
)

// ResumeStages are the stages in their order.
var ResumeStages = []string{StageRestoreStarted, StageRunning, StageReady, StageLoaded}

func newResumeStages(reg *prometheus.Registry) *observers {
	return newObservers(reg, prometheus.HistogramOpts{
		Name: "resume_latency_seconds", Help: "Resume latency, by driver and stage: from the resume command accepted (sandbox.resume_requested) to restore_started (the driver began the restore), running (the guest runs again: vm the cont answered, process the thaw done), ready (the new supervisor attached) or loaded (a lazy restore's memory all loaded).",
		Buckets: stepBuckets,
	}, "driver", "stage")
}

// ResumeStage observes a resume of driver's sandbox that reached stage d
// after its command was accepted. A negative d (clocks of another node
// behind this one's) is observed as 0.
func (s *Set) ResumeStage(driver, stage string, d time.Duration) {
	if s != nil {
		s.resumeStages.get(labels{driver, stage}).Observe(max(d, 0).Seconds())
	}
}
