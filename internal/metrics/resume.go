package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func newResumeStages(reg *prometheus.Registry) *observers {
	return newObservers(reg, prometheus.HistogramOpts{
		Name: "resume_latency_seconds", Help: "Resume latency, by driver and stage: from the resume command accepted (sandbox.resume_requested) to restore_started (the driver began the restore), running (the guest runs again: vm the cont answered, process the thaw done), ready (the new supervisor attached) or loaded (a lazy restore's memory all loaded).",
		Buckets: stepBuckets,
	}, "driver", "stage")
}

// ResumeStage observes a resume of driver's sandbox that reached stage
// (events.StageRestoreStarted, …: README "Resume latency", one definition
// for the metric, the bench and torpor top) d after its command was
// accepted. A negative d (clocks of another node
// behind this one's) is observed as 0.
func (s *Set) ResumeStage(driver, stage string, d time.Duration) {
	if s != nil {
		s.resumeStages.get(labels{driver, stage}).Observe(max(d, 0).Seconds())
	}
}
