package process_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
)

// BenchmarkFreezeThaw measures, with each freezer this machine has, the
// freeze and the thaw of a counting shell's process group (the shell and
// its sleep) as Suspend and Resume make them: each returns once the kernel
// says every process is frozen, or none is. It reports the p50 and p99 of
// each, in milliseconds (README, Drivers, has the figures).
func BenchmarkFreezeThaw(b *testing.B) {
	for _, kind := range process.Freezers() {
		b.Run(kind, func(b *testing.B) {
			if err := process.Available(kind); err != nil {
				b.Skipf("SKIPPED: %v", err)
			}
			g := newGateway(b)
			d, _ := newDriver(b, g, func(c *process.Config) { c.Freezer = kind; c.Heartbeat = time.Hour })
			spec := newSpec("sh", "-c", counterScript)
			startReady(b, d, g, spec, 1)
			freeze, thaw, err := process.FreezeThaw(d, spec.SandboxID)
			if err != nil {
				b.Fatal(err)
			}
			var frozen, thawed []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := freeze(ctx(b)); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := thaw(ctx(b)); err != nil {
					b.Fatal(err)
				}
				frozen, thawed = append(frozen, t1.Sub(t0)), append(thawed, time.Since(t1))
			}
			report(b, "freeze", frozen)
			report(b, "thaw", thawed)
		})
	}
}

// BenchmarkSuspendResume measures the driver's Suspend and Resume of a
// counting shell, each a new generation: the freeze or thaw and what the
// driver records around it (its state file, the handoff, the signal to the
// supervisor), not the supervisor's attach.
func BenchmarkSuspendResume(b *testing.B) {
	g := newGateway(b)
	d, _ := newDriver(b, g, func(c *process.Config) { c.Heartbeat = time.Hour })
	spec := newSpec("sh", "-c", counterScript)
	startReady(b, d, g, spec, 1)
	gen := int64(1)
	var suspends, resumes []time.Duration
	for b.Loop() {
		t0 := time.Now()
		ref, err := d.Suspend(ctx(b), compute.Target{Spec: spec, Generation: gen})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		gen++
		if _, err := d.Resume(ctx(b), compute.Resume{Spec: spec, Generation: gen, Credential: cred(gen), RestoreRef: ref}); err != nil {
			b.Fatal(err)
		}
		suspends, resumes = append(suspends, t1.Sub(t0)), append(resumes, time.Since(t1))
	}
	report(b, "suspend", suspends)
	report(b, "resume", resumes)
}

// report adds the p50 and p99 of ds to b's metrics, in milliseconds.
func report(b *testing.B, what string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(p float64) float64 { // as torpor bench takes them
		i := int(math.Ceil(p*float64(len(ds)))) - 1
		return float64(ds[max(0, min(i, len(ds)-1))].Nanoseconds()) / 1e6
	}
	b.ReportMetric(at(0.50), what+"-p50-ms")
	b.ReportMetric(at(0.99), what+"-p99-ms")
}
