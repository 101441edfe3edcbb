package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
)

// TestResumeReadyLatency: the attach of a restored generation observes
// torpor_resume_latency_seconds{stage="ready"} from the resume command
// accepted (the time of its sandbox.resume_requested) to the attach
// recorded; the attach of a created sandbox observes nothing.
func TestResumeReadyLatency(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	set := metrics.New()
	svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{Metrics: set}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	v := readySandbox(t, svc)
	command(VerbSuspend)(t, svc, v.ID)
	if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "sagas", &events.Suspended{Generation: 1, RestoreRef: "ref-1"}); err != nil {
		t.Fatal(err)
	}
	command(VerbResume)(t, svc, v.ID)
	envs, err := r.store.Load(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	request := envs[len(envs)-1]
	if request.Type != events.TypeResumeRequested {
		t.Fatalf("the log ends with %s, want %s", request.Type, events.TypeResumeRequested)
	}
	for _, e := range []events.Event{&events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}} {
		if err := svc.Record(ctx, request, "sagas", e); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := readyStage(t, set); got != 0 {
		t.Fatalf("before the resumed generation's attach: %d observed, want 0 (a created sandbox's attach is no resume)", got)
	}
	before := time.Now()
	if _, err := svc.Report(ctx, v.ID, attachReport(t, r, v.ID, 2)); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	count, sum := readyStage(t, set)
	lo, hi := before.Sub(request.Time).Seconds(), after.Sub(request.Time).Seconds()
	if count != 1 || sum < lo || sum > hi {
		t.Fatalf("ready stage: %d observed, %gs; want 1 in [%g, %g]s (resume accepted → attach recorded)", count, sum, lo, hi)
	}
}

// readyStage is the count and sum of the ready stage of the sim driver's
// resume latency in set.
func readyStage(t *testing.T, set *metrics.Set) (uint64, float64) {
	t.Helper()
	fams, err := set.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "torpor_resume_latency_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["driver"] == "sim" && l["stage"] == events.StageReady {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}
