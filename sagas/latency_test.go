package sagas_test

import (
	"context"
	"math"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
)

// stamping is a driver whose restores say the stages' times of a fake
// clock: started and running after the resume it was handed.
type stamping struct {
	*counting
	started, running time.Time
}

func (d stamping) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	res, err := d.counting.Resume(ctx, req)
	if err == nil {
		res.RestoreStartedAt, res.RunningAt = d.started, d.running
	}
	return res, err
}

// TestResumeLatencyFromTheRecordedTimes: the resume saga records the
// driver's stage times in sandbox.resumed and observes each stage's
// histogram as the interval from the command accepted (the time of
// sandbox.resume_requested) to that time; a stage the driver does not say
// (loaded: no lazy restore) is not observed.
func TestResumeLatencyFromTheRecordedTimes(t *testing.T) {
	set := metrics.New()
	h := newHarness(t, sagas.Config{Metrics: set})
	sb, ref := h.suspended(map[string]string{"resume": "ok"})
	accepted := time.Now().Add(-time.Second).UTC().Truncate(time.Millisecond) // the fake clock
	d := stamping{counting: newCounting(h.sim, ""), started: accepted.Add(15 * time.Millisecond), running: accepted.Add(240 * time.Millisecond)}
	h.run(d)
	in := sb.whenAt(&events.ResumeRequested{Generation: 2, RestoreRef: ref}, accepted)
	out := sb.outcome(in, 2)
	r, ok := out[1].(*events.Resumed)
	if !ok || !r.RestoreStartedAt.Equal(d.started) || !r.RunningAt.Equal(d.running) || !r.LoadedAt.IsZero() {
		t.Fatalf("outcome = %#v, want sandbox.resumed with restore_started_at %s, running_at %s and no loaded_at", out[1], d.started, d.running)
	}
	cases := []struct {
		stage string
		count uint64
		sum   float64
	}{
		{events.StageRestoreStarted, 1, 0.015},
		{events.StageRunning, 1, 0.240},
		{events.StageLoaded, 0, 0},
	}
	for _, c := range cases {
		count, sum := histogram(t, set, "torpor_resume_latency_seconds", map[string]string{"driver": "sim", "stage": c.stage})
		if count != c.count || math.Abs(sum-c.sum) > 1e-9 {
			t.Errorf("stage %s: count %d, sum %gs; want %d, %gs", c.stage, count, sum, c.count, c.sum)
		}
	}
}

// whenAt is when, the intent appended with time at (a fake clock's).
func (sb *sandbox) whenAt(e events.Event, at time.Time) events.Envelope {
	sb.h.t.Helper()
	env, err := events.NewEnvelope(sb.id, e, events.Meta{Actor: "test", CommandID: uuid.NewString()}, at)
	if err != nil {
		sb.h.t.Fatal(err)
	}
	envs, err := sb.h.store.appendNext(context.Background(), sb.id, false, env)
	if err != nil {
		sb.h.t.Fatal(err)
	}
	sb.intent = envs[0]
	return envs[0]
}

// histogram is the count and sum of the histogram name with labels in
// set, zero when it has none.
func histogram(t *testing.T, set *metrics.Set, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	fams, err := set.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := labels[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}
