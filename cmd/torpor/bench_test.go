package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// BenchmarkPipelineVsRaw runs the raw-bus and pipeline sections of `torpor
// bench` (quick sizes) in each durability mode and reports the figures and
// their ratio, measured in the same run:
//
//	go test -run XXX -bench PipelineVsRaw -benchtime 1x ./cmd/torpor
func BenchmarkPipelineVsRaw(b *testing.B) {
	for _, fsync := range []string{"interval", "always"} {
		b.Run(fsync, func(b *testing.B) {
			cfg := benchConfig{Sandboxes: 200, Concurrency: 16, Quick: true, Output: "table", Transport: "bus", Duration: 3 * time.Second}
			if err := cfg.defaults(); err != nil {
				b.Fatal(err)
			}
			var mr modeResult
			for b.Loop() {
				var err error
				if mr, err = runMode(context.Background(), cfg, fsync); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(mr.Raw.AppendCheckAsyncEPS, "raw-append/s")
			b.ReportMetric(mr.Pipeline.EventsPerS, "pipeline-events/s")
			b.ReportMetric(mr.Pipeline.TransitionsPerS, "transitions/s")
			b.ReportMetric(mr.Ratios["pipeline_vs_raw_append"], "ratio")
			b.ReportMetric(mr.Raw.BusFloorEPS, "bus-floor/s")
			b.ReportMetric(mr.Ratios["pipeline_vs_bus_floor"], "floor-ratio")
			b.ReportMetric(mr.Latency.P99, "p99-ms")
			b.ReportMetric(mr.Pipeline.CPUMsPerTransition, "cpu-ms/transition")
			b.ReportMetric(mr.Latency.CPUMsPerTransition, "open-cpu-ms/transition")
			b.ReportMetric(mr.Pipeline.ServerMsgsPerEvent, "server-msgs/event")
			if mr.Raw.AppendLatency != nil {
				b.ReportMetric(mr.Raw.AppendLatency.P99, "raw-append-p99-ms")
			}
		})
	}
}

// BenchmarkGrowth runs the growth section on small sizes (1k and 5k
// sandboxes, 200-event histories) and reports the latency ratio, the heap per
// sandbox and the rebuild ratio.
func BenchmarkGrowth(b *testing.B) {
	cfg := benchConfig{Sandboxes: 200, Concurrency: 16, Quick: true, Output: "table", Transport: "bus", Duration: 3 * time.Second}
	if err := cfg.defaults(); err != nil {
		b.Fatal(err)
	}
	cfg.sizes = []int{1000, 5000}
	var (
		g *growthResult
		r *replayResult
	)
	for b.Loop() {
		var err error
		if g, r, err = runGrowth(context.Background(), cfg, b.Output()); err != nil {
			b.Fatal(err)
		}
	}
	first, last := g.Rows[0], g.Rows[len(g.Rows)-1]
	b.ReportMetric(last.Steady.P50/first.Steady.P50, "latency-ratio")
	b.ReportMetric(g.HeapPerSandboxBytes, "heap-B/sandbox")
	b.ReportMetric(g.RecoverySeconds, "recovery-s")
	b.ReportMetric(r.KVRebuildEPS/r.RawOrderedReadEPS, "rebuild-ratio")
}

// TestBenchQuickReport runs a shortened bench end to end and checks that the
// JSON document has every figure the issue names, each measured (non-zero).
func TestBenchQuickReport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service under load for a few seconds")
	}
	cfg := benchConfig{Sandboxes: 20, Concurrency: 4, Quick: true, Output: "json", Transport: "bus", Duration: 600 * time.Millisecond, Fsync: "interval"}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	cfg.sizes, cfg.longSample, cfg.longHistory, cfg.sample = []int{100, 300}, 10, 50, 20
	rep, err := runBench(context.Background(), cfg, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]float64{
		"raw.append_check_async_eps":       rep.Raw.AppendCheckAsyncEPS,
		"raw.ordered_read_eps":             rep.Raw.OrderedReadEPS,
		"pipeline.events_per_s":            rep.Pipeline.EventsPerS,
		"pipeline.transitions_per_s":       rep.Pipeline.TransitionsPerS,
		"latency_ms.p50":                   rep.Latency.P50,
		"latency_ms.p99":                   rep.Latency.P99,
		"ratios.pipeline_vs_raw_append":    rep.Ratios["pipeline_vs_raw_append"],
		"ratios.kv_rebuild_vs_raw_read":    rep.Ratios["kv_rebuild_vs_raw_read"],
		"growth.heap_per_sandbox_bytes":    rep.Growth.HeapPerSandboxBytes,
		"growth.recovery_seconds":          rep.Growth.RecoverySeconds,
		"replay.kv_rebuild_eps":            rep.Replay.KVRebuildEPS,
		"raw.append_latency_ms.p99":        rep.Raw.AppendLatency.P99,
		"pipeline.cpu_ms_per_transition":   rep.Pipeline.CPUMsPerTransition,
		"pipeline.cores_busy":              rep.Pipeline.CoresBusy,
		"latency_ms.cpu_ms_per_transition": rep.Latency.CPUMsPerTransition,
	} {
		if !(v > 0) {
			t.Errorf("%s = %v, want a measured figure", name, v)
		}
	}
	var split int
	for _, verb := range []string{"suspend", "resume"} {
		l := rep.Latency.ByVerb[verb]
		if l == nil || l.Samples == 0 || !(l.P50 > 0) {
			t.Errorf("latency_ms.by_verb.%s = %+v, want measured samples", verb, l)
			continue
		}
		split += l.Samples
	}
	if split != rep.Latency.Samples {
		t.Errorf("by_verb holds %d samples, the latency run %d", split, rep.Latency.Samples)
	}
	// Every command that came due was sent and measured, or skipped.
	for name, l := range map[string]latencyResult{"latency_ms": rep.Latency, "raw.append_latency_ms": *rep.Raw.AppendLatency} {
		if l.Offered == 0 || l.Samples+l.Skipped != l.Offered {
			t.Errorf("%s: %d samples and %d skipped of %d offered", name, l.Samples, l.Skipped, l.Offered)
		}
	}
	// Each event is at least published and acknowledged, and the pipeline
	// also delivers it to its readers.
	if m := rep.Pipeline.ServerMsgsPerEvent; m <= 2 {
		t.Errorf("pipeline.server_msgs_per_event = %.2f, want more than a raw append's 2", m)
	}
	// The host probe ran beside both timed runs (it reads a thread's CPU
	// time, on Linux).
	if runtime.GOOS == "linux" {
		for name, h := range map[string]*hostResult{"pipeline.host": rep.Pipeline.Host, "latency_ms.host": rep.Latency.Host} {
			if h == nil || h.Chunks == 0 || !(h.ChunkUS > 0) {
				t.Errorf("%s = %+v, want the probe's chunks", name, h)
			}
		}
	}
	if b := rep.Pipeline.CoresBusy; b > 1.05 {
		t.Errorf("pipeline.cores_busy = %.2f, more than every core", b)
	}
	if len(rep.Targets) < 5 {
		t.Errorf("%d targets checked, want every target the run measured", len(rep.Targets))
	}
	// Events appended per transition: a suspend or a resume appends at least
	// its request and its outcome.
	if per := float64(rep.Pipeline.Events) / float64(rep.Pipeline.Transitions); per < 2 {
		t.Errorf("%.2f events per transition; the count of events appended is wrong", per)
	}
}

// TestShareIsDisjoint checks that the closed loop's clients split the
// sandboxes without overlap, also when the count is not a multiple of the
// clients: two clients cycling one sandbox wait on each other's outcomes.
func TestShareIsDisjoint(t *testing.T) {
	for _, tc := range []struct{ n, c int }{{1000, 64}, {20, 4}, {22, 4}, {3, 8}, {1, 1}} {
		ids := make([]string, tc.n)
		for i := range ids {
			ids[i] = fmt.Sprint(i)
		}
		seen := map[string]int{}
		for w := 0; w < tc.c; w++ {
			for _, id := range share(ids, w, tc.c) {
				seen[id]++
			}
		}
		if len(seen) != tc.n {
			t.Errorf("n=%d c=%d: %d sandboxes shared out, want all %d", tc.n, tc.c, len(seen), tc.n)
		}
		for id, k := range seen {
			if k != 1 {
				t.Errorf("n=%d c=%d: sandbox %s given to %d clients", tc.n, tc.c, id, k)
			}
		}
	}
}

// TestOneWaitPerSandbox checks that the view waiter refuses a second wait on
// a sandbox, which would steal the first one's wake-up.
func TestOneWaitPerSandbox(t *testing.T) {
	vw := &viewWaiter{waits: map[string]*phaseWait{}}
	if _, err := vw.expect("a", events.PhaseSuspended); err != nil {
		t.Fatal(err)
	}
	if _, err := vw.expect("a", events.PhaseReady); err == nil {
		t.Fatal("a second wait on one sandbox was accepted")
	}
	vw.cancel("a")
	if _, err := vw.expect("a", events.PhaseReady); err != nil {
		t.Fatalf("after cancel: %v", err)
	}
}

// TestMixAlternates checks that the open loop offers suspends and resumes in
// turn, as the closed loop runs them, rather than in waves of one kind: from
// all ready, with commands that finish at once, the verbs alternate after
// the first suspend; with none finishing, each tick takes what is idle, and
// a tick with nothing idle is refused.
func TestMixAlternates(t *testing.T) {
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprint(i)
	}
	verb := func(suspended bool) string {
		if suspended {
			return "resume"
		}
		return "suspend"
	}

	m := newMix(ids)
	var got []string
	for k := range 8 {
		id, suspended, ok := m.take(k)
		if !ok {
			t.Fatalf("tick %d: nothing idle, with every command finished", k)
		}
		got = append(got, verb(suspended))
		m.done(id, !suspended)
	}
	// Tick 1 wants a resume; the first suspend has finished, so one is idle.
	want := "suspend resume suspend resume suspend resume suspend resume"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("finishing at once: got %s, want %s", g, want)
	}

	m = newMix(ids[:3])
	got = got[:0]
	for k := range 4 {
		_, suspended, ok := m.take(k)
		if !ok {
			got = append(got, "skip")
			continue
		}
		got = append(got, verb(suspended))
	}
	want = "suspend suspend suspend skip"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("none finishing: got %s, want %s", g, want)
	}

	// A sandbox goes back idle in the phase its command left it in.
	m = newMix(ids[:1])
	id, _, _ := m.take(0)
	m.done(id, true)
	if id2, suspended, ok := m.take(0); !ok || id2 != id || !suspended {
		t.Errorf("after a suspend: took %q suspended=%v ok=%v, want %q suspended", id2, suspended, ok, id)
	}
}

// TestOfferSendsEveryCommandDue checks that the open loop's schedule sends
// each of rate × d commands once, in order, whether or not it keeps up: a
// send that takes longer than the interval does not drop the ones that
// came due meanwhile. Skips are counted.
func TestOfferSendsEveryCommandDue(t *testing.T) {
	for _, tc := range []struct {
		name string
		slow time.Duration
	}{{"keeping up", 0}, {"late", 3 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			offered, skipped, err := offer(context.Background(), 2000, 20*time.Millisecond, func(k int) bool {
				got = append(got, k)
				time.Sleep(tc.slow)
				return k%4 != 3
			})
			if err != nil {
				t.Fatal(err)
			}
			if offered != 40 || len(got) != 40 {
				t.Fatalf("offered %d, sent %d; want 40 (2000/s for 20ms)", offered, len(got))
			}
			for i, k := range got {
				if k != i {
					t.Fatalf("command %d sent as %d; want each once, in order", i, k)
				}
			}
			if skipped != 10 {
				t.Errorf("skipped %d, want 10", skipped)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := offer(ctx, 10, time.Second, func(int) bool { return true }); err == nil {
		t.Error("a cancelled offer returned no error")
	}
}

// TestJudgeHost checks how the host probe's chunk times become a verdict:
// a chunk five times its usual time or more is slow and stands for one
// probe interval, consecutive slow chunks are one episode, and the worst
// chunk is reported as a multiple.
func TestJudgeHost(t *testing.T) {
	us := time.Microsecond
	ds := []time.Duration{100 * us, 120 * us, 600 * us, 1400 * us, 90 * us, 499 * us, 500 * us, 100 * us}
	got := judge(ds, 100*us)
	want := hostResult{Chunks: 8, ChunkUS: 100, SlowChunks: 3, SlowMS: 15, Episodes: 2, WorstX: 14}
	if *got != want {
		t.Errorf("judge: got %+v, want %+v", *got, want)
	}
	if got := judge(nil, 100*us); got.Chunks != 0 || got.SlowChunks != 0 || got.Episodes != 0 {
		t.Errorf("judge of no chunks: %+v", *got)
	}
}

// TestBenchFlagsRefused checks that every bad bench setting fails before
// anything runs, with a message naming the flag.
func TestBenchFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sandboxes", "0"}, "--sandboxes"},
		{[]string{"--concurrency", "0"}, "--concurrency"},
		{[]string{"--sandboxes", "4", "--concurrency", "8"}, "--concurrency 8 above --sandboxes 4"},
		{[]string{"--fsync", "sometimes"}, "--fsync"},
		{[]string{"--transport", "carrier-pigeon"}, "--transport"},
		{[]string{"-o", "yaml"}, "-o"},
		{[]string{"--duration", "0s"}, "--duration"},
		{[]string{"--rate", "-5"}, "--rate"},
		{[]string{"--rate", "NaN"}, "--rate"},
		{[]string{"--rate", "Inf"}, "--rate"},
	} {
		cmd := rootCmd()
		cmd.SetArgs(append([]string{"bench"}, tc.args...))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		start := time.Now()
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %v: got %v, want an error naming %q", tc.args, err, tc.want)
		}
		// Nothing ran: the raw section alone takes seconds.
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("bench %v: refused after %s; the check should come first", tc.args, d)
		}
	}
}

// TestBenchRate checks that --rate sets the latency run's offer, and that
// the p99 target, which is set at half the measured maximum, is then not
// judged but noted.
func TestBenchRate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service under load for a few seconds")
	}
	cfg := benchConfig{Sandboxes: 20, Concurrency: 4, Quick: true, Output: "json", Transport: "bus", Duration: 600 * time.Millisecond, Fsync: "interval", SkipGrowth: true, Rate: 50}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	rep, err := runBench(context.Background(), cfg, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Latency.OfferedPerS != 50 || rep.Latency.Offered != 30 {
		t.Errorf("latency run offered %v/s, %d commands; want 50/s, 30 over 600ms", rep.Latency.OfferedPerS, rep.Latency.Offered)
	}
	for _, tg := range rep.Targets {
		if strings.HasPrefix(tg.Name, "p99") {
			t.Errorf("p99 target judged at --rate 50: %+v", tg)
		}
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "--rate 50") }) {
		t.Errorf("notes %q do not say the p99 target was not judged", rep.Notes)
	}
}
