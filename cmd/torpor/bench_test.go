package main

import (
	"context"
	"encoding/json"
	"github.com/torpor/torpor/services/compute/vm"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/bench"
	"github.com/torpor/torpor/internal/pgtest"
	"github.com/torpor/torpor/services/node/servetest"
)

// BenchmarkPipelineVsRaw runs the raw-bus and pipeline sections of `torpor
// bench` (quick sizes) in each durability mode and reports the figures and
// their ratio, measured in the same run:
//
//	go test -run XXX -bench PipelineVsRaw -benchtime 1x ./cmd/torpor
func BenchmarkPipelineVsRaw(b *testing.B) {
	for _, fsync := range []string{"interval", "always"} {
		b.Run(fsync, func(b *testing.B) {
			cfg := bench.Config{Sandboxes: 200, Concurrency: 16, Quick: true, Transport: "bus", Duration: 3 * time.Second}
			var mr bench.Mode
			for b.Loop() {
				var err error
				if mr, err = bench.RunMode(context.Background(), cfg, fsync, benchStart); err != nil {
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
			if mr.Busy != nil {
				b.ReportMetric(mr.Busy.P99, "p99-ms-at-half-busy")
				b.ReportMetric(mr.Busy.OfferedPerS, "half-busy-transitions/s")
			}
			b.ReportMetric(mr.HTTP.TransitionsPerS, "http-transitions/s")
			b.ReportMetric(mr.Ratios["http_vs_closed_loop_transitions"], "http-ratio")
			b.ReportMetric(mr.Pipeline.CPUMsPerTransition, "cpu-ms/transition")
			b.ReportMetric(mr.Latency.CPUMsPerTransition, "open-cpu-ms/transition")
			b.ReportMetric(mr.Pipeline.ServerMsgsPerEvent, "server-msgs/event")
			if mr.Raw.AppendLatency != nil {
				b.ReportMetric(mr.Raw.AppendLatency.P99, "raw-append-p99-ms")
			}
		})
	}
}

// BenchmarkCluster runs the cluster section of `torpor bench` (quick
// sizes): the raw R3 append and the closed loop through three nodes on three
// in-process servers, every stream R3.
//
//	go test -run XXX -bench Cluster -benchtime 1x ./cmd/torpor
func BenchmarkCluster(b *testing.B) {
	cfg := bench.Config{Sandboxes: 200, Concurrency: 16, Quick: true, Transport: "bus", Duration: 3 * time.Second}
	var c *bench.Cluster
	for b.Loop() {
		var err error
		if c, err = bench.RunCluster(context.Background(), cfg, "interval", benchNode, b.Output()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(c.RawAppendCheckAsyncEPS, "raw-r3-append/s")
	b.ReportMetric(c.Pipeline.EventsPerS, "pipeline-events/s")
	b.ReportMetric(c.Pipeline.TransitionsPerS, "transitions/s")
	b.ReportMetric(c.Pipeline.EventsPerS/c.RawAppendCheckAsyncEPS, "ratio")
	b.ReportMetric(c.Pipeline.P50, "p50-ms")
	b.ReportMetric(c.Pipeline.P99, "p99-ms")
	b.ReportMetric(c.Pipeline.CPUMsPerTransition, "cpu-ms/transition")
}

// BenchmarkGrowth runs the growth section on small sizes (1k and 5k
// sandboxes, 200-event histories) and reports the latency ratio, the heap per
// sandbox and the rebuild ratio.
func BenchmarkGrowth(b *testing.B) {
	cfg := bench.Config{Sandboxes: 200, Concurrency: 16, Quick: true, Transport: "bus", Duration: 3 * time.Second, Sizes: []int{1000, 5000}}
	var (
		g *bench.Growth
		r *bench.Replay
	)
	for b.Loop() {
		var err error
		if g, r, err = bench.RunGrowth(context.Background(), cfg, benchStart, b.Output()); err != nil {
			b.Fatal(err)
		}
	}
	first, last := g.Rows[0], g.Rows[len(g.Rows)-1]
	b.ReportMetric(last.Steady.P50/first.Steady.P50, "latency-ratio")
	b.ReportMetric(g.HeapPerSandboxBytes, "heap-B/sandbox")
	b.ReportMetric(g.RecoverySeconds, "recovery-s")
	b.ReportMetric(r.KVRebuildEPS/r.RawOrderedReadEPS, "rebuild-ratio")
}

// BenchmarkProcess runs the process section of `torpor bench` (quick
// sizes): freeze and thaw with each freezer here, and process sandboxes
// suspended and resumed through the pipeline.
//
//	go test -run XXX -bench Process -benchtime 1x ./cmd/torpor
func BenchmarkProcess(b *testing.B) {
	cfg := bench.Config{Sandboxes: 1, Concurrency: 1, Quick: true, Transport: "bus", Duration: time.Second}
	var p *bench.Process
	for b.Loop() {
		var err error
		if p, err = bench.RunProcess(context.Background(), cfg, benchStarter(binary(b)), b.Output()); err != nil {
			b.Fatal(err)
		}
	}
	for _, f := range p.Freezers {
		if f.Cycles > 0 {
			name := strings.ReplaceAll(f.Freezer, " ", "-")
			b.ReportMetric(f.Freeze.P99, name+"-freeze-p99-ms")
			b.ReportMetric(f.Thaw.P99, name+"-thaw-p99-ms")
		}
	}
	b.ReportMetric(p.Suspend.P50, "suspend-to-suspended-p50-ms")
	b.ReportMetric(p.Suspend.P99, "suspend-to-suspended-p99-ms")
	b.ReportMetric(p.Resume.P50, "resume-to-ready-p50-ms")
	b.ReportMetric(p.Resume.P99, "resume-to-ready-p99-ms")
}

// BenchmarkWake runs the wake-on-traffic row of `torpor bench` (quick
// sizes): a suspended process sandbox woken by a GET through its forward.
//
//	go test -run XXX -bench Wake -benchtime 1x ./cmd/torpor
func BenchmarkWake(b *testing.B) {
	servetest.Need(b, "busybox")
	cfg := bench.Config{Sandboxes: 1, Concurrency: 1, Quick: true, Transport: "bus", Duration: time.Second}
	var w *bench.Wake
	for b.Loop() {
		var err error
		if w, err = bench.RunWake(context.Background(), cfg, benchStarter(binary(b)), b.Output()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(w.Latency.P50, "wake-p50-ms")
	b.ReportMetric(w.Latency.P99, "wake-p99-ms")
}

// BenchmarkVMWake runs the vm wake-on-traffic row of `torpor bench`: a
// suspended vm sandbox woken by a GET through its forward. It skips where
// the row cannot run (the vm driver's parts missing, or the guest's network
// modules: Driver.Unnetworked).
//
//	go test -run XXX -bench VMWake -benchtime 1x ./cmd/torpor
func BenchmarkVMWake(b *testing.B) {
	cfg := bench.Config{Sandboxes: 1, Concurrency: 1, Quick: true, Transport: "bus", Duration: time.Second}
	var w *bench.Wake
	for b.Loop() {
		var err error
		if w, err = bench.RunVMWake(context.Background(), cfg, benchStarter(binary(b)), b.Output()); err != nil {
			b.Fatal(err)
		}
		if w.Missing != "" {
			b.Skipf("SKIPPED, NOT MEASURED: %s", w.Missing)
		}
	}
	b.ReportMetric(w.Latency.P50, "wake-p50-ms")
	b.ReportMetric(w.Latency.P99, "wake-p99-ms")
}

// TestBenchQuickReport runs a shortened bench end to end and checks that the
// JSON document has every figure the issue names, each measured (non-zero).
func TestBenchQuickReport(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service under load for a few seconds")
	}
	// The vm section boots emulated guests for minutes; RunVM has its own
	// test (TestBenchVM).
	cfg := bench.Config{Sandboxes: 20, Concurrency: 4, Quick: true, Transport: "bus", Duration: 600 * time.Millisecond, Fsync: "interval",
		Sizes: []int{100, 300}, LongSample: 10, LongHistory: 50, Sample: 20, SkipVM: true, StartNode: benchNode}
	rep, err := bench.Run(context.Background(), cfg, benchStarter(binary(t)), t.Output())
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]float64{
		"raw.append_check_async_eps":             rep.Raw.AppendCheckAsyncEPS,
		"raw.ordered_read_eps":                   rep.Raw.OrderedReadEPS,
		"pipeline.events_per_s":                  rep.Pipeline.EventsPerS,
		"pipeline.transitions_per_s":             rep.Pipeline.TransitionsPerS,
		"latency_ms.p50":                         rep.Latency.P50,
		"latency_ms.p99":                         rep.Latency.P99,
		"ratios.pipeline_vs_raw_append":          rep.Ratios["pipeline_vs_raw_append"],
		"ratios.kv_rebuild_vs_raw_read":          rep.Ratios["kv_rebuild_vs_raw_read"],
		"growth.heap_per_sandbox_bytes":          rep.Growth.HeapPerSandboxBytes,
		"growth.recovery_seconds":                rep.Growth.RecoverySeconds,
		"replay.kv_rebuild_eps":                  rep.Replay.KVRebuildEPS,
		"raw.append_latency_ms.p99":              rep.Raw.AppendLatency.P99,
		"pipeline.cpu_ms_per_transition":         rep.Pipeline.CPUMsPerTransition,
		"pipeline.cores_busy":                    rep.Pipeline.CoresBusy,
		"latency_ms.cpu_ms_per_transition":       rep.Latency.CPUMsPerTransition,
		"pipeline.p50_ms":                        rep.Pipeline.P50,
		"pipeline.p99_ms":                        rep.Pipeline.P99,
		"http_closed_loop.transitions_per_s":     rep.HTTP.TransitionsPerS,
		"http_closed_loop.p50_ms":                rep.HTTP.P50,
		"http_closed_loop.p99_ms":                rep.HTTP.P99,
		"http_closed_loop.cpu_ms_per_transition": rep.HTTP.CPUMsPerTransition,
		"ratios.http_vs_closed_loop_transitions": rep.Ratios["http_vs_closed_loop_transitions"],
		"ratios.http_vs_closed_loop_p50":         rep.Ratios["http_vs_closed_loop_p50"],
		"ratios.http_vs_closed_loop_per_cpu":     rep.Ratios["http_vs_closed_loop_per_cpu"],
	} {
		if !(v > 0) {
			t.Errorf("%s = %v, want a measured figure", name, v)
		}
	}
	// The bare round trips of both command paths were measured with the
	// closed loop's clients; the CPU time is read on Linux.
	for name, rt := range map[string]*bench.RoundTrip{"raw.http_round_trip": rep.Raw.HTTPRoundTrip, "raw.bus_request": rep.Raw.BusRequest} {
		if rt == nil || !(rt.PerS > 0) || rt.Concurrency != cfg.Concurrency || (runtime.GOOS == "linux" && !(rt.CPUMicros > 0)) {
			t.Errorf("%s = %+v, want a measured figure with %d clients", name, rt, cfg.Concurrency)
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
	for name, l := range map[string]bench.Latency{"latency_ms": rep.Latency, "raw.append_latency_ms": *rep.Raw.AppendLatency} {
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
		for name, h := range map[string]*bench.Host{"pipeline.host": rep.Pipeline.Host, "latency_ms.host": rep.Latency.Host} {
			if h == nil || h.Chunks == 0 || !(h.ChunkUS > 0) {
				t.Errorf("%s = %+v, want the probe's chunks", name, h)
			}
		}
	}
	// The HTTP loop's clients cycle through suspend and resume in pairs, as
	// the closed loop's do, and the ratios are of the two loops' figures.
	if h := rep.HTTP; h.Transitions%2 != 0 || h.Concurrency != cfg.Concurrency ||
		rep.Ratios["http_vs_closed_loop_transitions"] != h.TransitionsPerS/rep.Pipeline.TransitionsPerS {
		t.Errorf("http_closed_loop = %+v, ratios %v", h, rep.Ratios)
	}
	if b := rep.Pipeline.CoresBusy; b > 1.05 {
		t.Errorf("pipeline.cores_busy = %.2f, more than every core", b)
	}
	if len(rep.Targets) < 5 {
		t.Errorf("%d targets checked, want every target the run measured", len(rep.Targets))
	}
	// The targets as restated: the pipeline against the bus floor (fsync
	// interval), the p99 at half the cores busy; the p99 at half the
	// maximum rate is a figure, no longer a target.
	names := map[string]bench.Target{}
	for _, tg := range rep.Targets {
		names[tg.Name] = tg
	}
	if tg, ok := names["pipeline events/s ÷ bus floor (interval)"]; !ok || tg.Value != rep.Ratios["pipeline_vs_bus_floor"] || tg.Want != 0.5 {
		t.Errorf("bus floor target %+v (found %v), want the ratio pipeline_vs_bus_floor against 0.5", tg, ok)
	}
	if _, ok := names["pipeline events/s ÷ raw async append (interval)"]; ok {
		t.Error("the interval pipeline is still held to the raw append; its target is the bus floor")
	}
	for name := range names {
		if strings.Contains(name, "half the max") {
			t.Errorf("target %q: the p99 at half the maximum is a figure, not a target", name)
		}
	}
	if runtime.GOOS == "linux" {
		checkBusy(t, rep)
		if tg, ok := names["p99 ms at 50% of the cores busy (interval)"]; !ok || tg.Value != rep.Busy.P99 || tg.Want != 10 {
			t.Errorf("p99 target %+v (found %v), want the p99 of the run at 50%% busy against 10 ms", tg, ok)
		}
	}
	// Every key of the document, old and new, at the top and in each mode.
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Top    map[string]json.RawMessage
		Config map[string]json.RawMessage   `json:"config"`
		Modes  []map[string]json.RawMessage `json:"modes"`
	}
	if err := json.Unmarshal(data, &doc.Top); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	has := func(where string, m map[string]json.RawMessage, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("%s has no key %q", where, k)
			}
		}
	}
	perMode := []string{"raw", "pipeline", "latency_ms", "ratios", "http_closed_loop", "latency_at_50pct_busy_ms"}
	has("the report", doc.Top, append([]string{"machine", "config", "modes", "growth", "replay", "process", "targets", "notes", "seconds"}, perMode...)...)
	has("config", doc.Config, "sandboxes", "concurrency", "fsync", "quick", "transport", "duration", "growth_sizes", "rate")
	for _, m := range doc.Modes {
		has("a mode", m, append([]string{"fsync"}, perMode...)...)
	}
	checkProcess(t, rep, names)
	checkBenchCluster(t, rep)
	// Events appended per transition: a suspend or a resume appends at least
	// its request and its outcome.
	if per := float64(rep.Pipeline.Events) / float64(rep.Pipeline.Transitions); per < 2 {
		t.Errorf("%.2f events per transition; the count of events appended is wrong", per)
	}
}

// checkBenchCluster checks the cluster section: the closed loop ran through
// three nodes on three servers with R3 streams in the primary mode, every
// node's gateway handled some of its commands (one per transition), and
// the ratios to the single node's run are measured and are the two runs'
// figures; the table has both rows.
func checkBenchCluster(t *testing.T, rep *bench.Report) {
	t.Helper()
	c := rep.Cluster
	if c == nil {
		t.Fatal("the report has no cluster section")
	}
	if c.Servers != 3 || c.Nodes != 3 || c.Replicas != 3 || c.Fsync != rep.Modes[0].Fsync || !strings.Contains(c.Auth, "operator") {
		t.Errorf("cluster %d servers, %d nodes, R%d, fsync %s, auth %q; want 3, 3, R3, the primary mode's %s, operator mode", c.Servers, c.Nodes, c.Replicas, c.Fsync, c.Auth, rep.Modes[0].Fsync)
	}
	p := c.Pipeline
	if p.Transitions == 0 || p.Transitions%2 != 0 || p.Concurrency != rep.Pipeline.Concurrency || p.Sandboxes != rep.Pipeline.Sandboxes || !(p.P50 > 0) || p.Events < uint64(2*p.Transitions) {
		t.Errorf("cluster closed loop %+v, want suspend/resume pairs with the single node's load, at least two events each", p)
	}
	if !(c.RawAppendCheckAsyncEPS > 0) || !(c.RawAppendCheckSyncEPS > 0) {
		t.Errorf("cluster raw appends sync %v, async %v: want measured figures", c.RawAppendCheckSyncEPS, c.RawAppendCheckAsyncEPS)
	}
	var commands int64
	for i, n := range c.Commands {
		if n == 0 {
			t.Errorf("node %s handled no command of the closed loop: %v", c.NodeNames[i], c.Commands)
		}
		commands += n
	}
	if len(c.Commands) != 3 || commands != p.Transitions {
		t.Errorf("commands by node %v (%d), want three nodes' and one per transition (%d)", c.Commands, commands, p.Transitions)
	}
	for name, want := range map[string]float64{
		"cluster_vs_single_transitions":  p.TransitionsPerS / rep.Pipeline.TransitionsPerS,
		"cluster_vs_single_p50":          p.P50 / rep.Pipeline.P50,
		"cluster_vs_single_raw_append":   c.RawAppendCheckAsyncEPS / rep.Raw.AppendCheckAsyncEPS,
		"cluster_pipeline_vs_raw_append": p.EventsPerS / c.RawAppendCheckAsyncEPS,
	} {
		if got, ok := rep.Ratios[name]; !ok || !(got > 0) || got != want {
			t.Errorf("ratios.%s = %v (found %v), want %v > 0", name, got, ok, want)
		}
	}
	var out strings.Builder
	rep.Print(&out)
	for _, want := range []string{"single embedded node", "cluster, R3", "cluster ÷ single (fsync interval, same run): transitions/s "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, out.String())
		}
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.HasPrefix(n, "cluster: ") && strings.Contains(n, "operator mode") }) {
		t.Errorf("notes %q do not say how the cluster ran", rep.Notes)
	}
}

// TestBenchSkipCluster: --skip-cluster leaves the cluster section out, and
// the bench without a node starter refuses to run it before anything runs.
func TestBenchSkipCluster(t *testing.T) {
	cfg := bench.Config{Sandboxes: 20, Concurrency: 4, Quick: true, Transport: "bus", Duration: 400 * time.Millisecond, Fsync: "interval"}
	start := time.Now()
	if _, err := bench.Run(context.Background(), cfg, benchStart, io.Discard); err == nil || !strings.Contains(err.Error(), "--skip-cluster") {
		t.Errorf("a bench with the cluster and no node starter: %v, want an error naming --skip-cluster", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refused after %s; the check should come first", d)
	}
	if testing.Short() {
		return
	}
	cfg.SkipCluster, cfg.SkipGrowth, cfg.SkipProcess, cfg.SkipVM = true, true, true, true
	rep, err := bench.Run(context.Background(), cfg, benchStart, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Cluster != nil {
		t.Errorf("--skip-cluster ran the cluster: %+v", rep.Cluster)
	}
	for k := range rep.Ratios {
		if strings.HasPrefix(k, "cluster") {
			t.Errorf("ratio %s without the cluster", k)
		}
	}
}

// checkProcess checks the process section: every freezer measured where it
// is available (the first of them at least) or said missing, and held to
// its targets; process sandboxes suspended and resumed through the pipeline
// as many times as the section says.
func checkProcess(t *testing.T, rep *bench.Report, targets map[string]bench.Target) {
	t.Helper()
	p := rep.Process
	if p == nil {
		t.Fatal("the report has no process section")
	}
	measured := 0
	for _, f := range p.Freezers {
		switch {
		case f.Missing != "":
			if f.Cycles != 0 {
				t.Errorf("freezer %s is missing (%s) yet measured", f.Freezer, f.Missing)
			}
			continue
		case f.Cycles == 0 || f.Freeze.Samples != f.Cycles || f.Thaw.Samples != f.Cycles || !(f.Freeze.P50 > 0) || !(f.Thaw.P99 > 0):
			t.Errorf("freezer %+v: want %d measured freezes and thaws", f, f.Cycles)
		}
		measured++
		for _, what := range []string{"freeze", "thaw"} {
			name := "process group " + what + " p99 ms (" + f.Freezer + ")"
			want := f.Freeze.P99
			if what == "thaw" {
				want = f.Thaw.P99
			}
			if tg, ok := targets[name]; !ok || tg.Value != want || tg.Want != 10 {
				t.Errorf("target %q = %+v (found %v), want the p99 %v against 10 ms", name, tg, ok, want)
			}
		}
	}
	if measured == 0 {
		t.Errorf("no freezer measured: %+v", p.Freezers)
	}
	n := p.Sandboxes * p.Rounds
	for name, l := range map[string]bench.Percentiles{"suspend→suspended": p.Suspend, "resume→ready": p.Resume} {
		if n == 0 || l.Samples != n || !(l.P50 > 0) || l.P99 < l.P50 || l.Max < l.P99 {
			t.Errorf("process %s: %+v, want %d samples", name, l, n)
		}
	}
	var out strings.Builder
	rep.Print(&out)
	if !strings.Contains(out.String(), "process sandboxes through the pipeline") {
		t.Errorf("the table has no process line:\n%s", out.String())
	}
}

// TestBenchFlagsRefused checks that a bad output, or a bench setting the
// bench refuses (bench.Config.Validate has every case), fails before
// anything runs, with a message naming the flag.
func TestBenchFlagsRefused(t *testing.T) {
	noTargets := filepath.Join(t.TempDir(), "empty.md")
	if err := os.WriteFile(noTargets, []byte("# torpor benchmarks\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "yaml"}, "-o"},
		{[]string{"--runs", "-1"}, "--runs -1"},
		{[]string{"--compare", filepath.Join(t.TempDir(), "missing.md")}, "--compare: open"},
		{[]string{"--compare", noTargets}, "--compare: " + noTargets + ": no target lines"},
		{[]string{"--sandboxes", "4", "--concurrency", "8"}, "--concurrency 8 above --sandboxes 4"},
		{[]string{"--rate", "NaN"}, "--rate"},
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
	cfg := bench.Config{Sandboxes: 20, Concurrency: 4, Quick: true, Transport: "bus", Duration: 600 * time.Millisecond, Fsync: "interval", SkipGrowth: true, SkipProcess: true, SkipVM: true, SkipCluster: true, Rate: 50}
	rep, err := bench.Run(context.Background(), cfg, benchStart, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Latency.OfferedPerS != 50 || rep.Latency.Offered != 30 {
		t.Errorf("latency run offered %v/s, %d commands; want 50/s, 30 over 600ms", rep.Latency.OfferedPerS, rep.Latency.Offered)
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "--rate 50") }) {
		t.Errorf("notes %q do not say the latency figure run offered --rate 50", rep.Notes)
	}
	if runtime.GOOS != "linux" {
		return
	}
	// The p99 target is judged all the same, on the run at half busy,
	// whose search started from the cost of the run at --rate.
	checkBusy(t, rep)
	judged := slices.ContainsFunc(rep.Targets, func(tg bench.Target) bool {
		return tg.Name == "p99 ms at 50% of the cores busy (interval)" && tg.Value == rep.Busy.P99
	})
	if !judged {
		t.Errorf("targets %+v: the p99 target was not judged at --rate 50", rep.Targets)
	}
	if first, want := rep.Busy.Calibration[0].OfferedPerS, min(50*busyAim/rep.Latency.CoresBusy, rep.Pipeline.TransitionsPerS/2); first != want {
		t.Errorf("the first calibration offered %v/s, want %v: 50/s corrected by its %.0f%% busy", first, want, 100*rep.Latency.CoresBusy)
	}
}

// busyAim is the share of busy cores the calibration runs aim at: the
// middle of the 45–50% they must land in.
const busyAim = 0.475

// checkBusy checks the run at half busy: measured, calibrated in one to
// three runs, its rate the one the last calibration settled on (45–50%
// busy) or led to, never above half the closed loop's rate, and probed for slow
// episodes.
func checkBusy(t *testing.T, rep *bench.Report) {
	t.Helper()
	b := rep.Busy
	if b == nil {
		t.Fatal("latency_at_50pct_busy_ms is missing")
	}
	if b.Samples == 0 || !(b.P99 > 0) || !(b.CoresBusy > 0) || !(b.CPUMsPerTransition > 0) || b.Samples+b.Skipped != b.Offered {
		t.Errorf("latency_at_50pct_busy_ms = %+v, want a measured run", b.Latency)
	}
	if b.Host == nil || b.Host.Chunks == 0 {
		t.Errorf("latency_at_50pct_busy_ms.host = %+v, want the probe's chunks", b.Host)
	}
	if n := len(b.Calibration); n < 1 || n > 3 {
		t.Fatalf("%d calibration runs, want 1 to 3", n)
	}
	half := rep.Pipeline.TransitionsPerS / 2 // half the capacity: the most it offers
	for _, c := range b.Calibration {
		if !(c.OfferedPerS > 0) || !(c.CoresBusy > 0) || c.OfferedPerS > half {
			t.Errorf("calibration %+v: want a measured run, at most half the closed loop's %.0f/s", c, rep.Pipeline.TransitionsPerS)
		}
	}
	last := b.Calibration[len(b.Calibration)-1]
	want := last.OfferedPerS // settled
	if last.CoresBusy < 0.45 || last.CoresBusy > 0.5 {
		want = min(last.OfferedPerS*busyAim/last.CoresBusy, half)
	}
	if b.OfferedPerS != want {
		t.Errorf("the run at half busy offered %v/s; after a calibration at %v/s, %.0f%% busy, want %v/s", b.OfferedPerS, last.OfferedPerS, 100*last.CoresBusy, want)
	}
}

// TestBenchQuickReportSQL runs a shortened bench with --database-url and
// checks the figures reach every place they are read from: raw.sql_upsert_eps
// in the JSON (top level and each mode), the SQL view's section (live apply
// rate and lag, rebuild rate next to the raw upsert), the table's lines and
// the two SQL targets.
func TestBenchQuickReportSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service under load for a few seconds")
	}
	url := pgtest.URL(t)
	cfg := bench.Config{Sandboxes: 20, Concurrency: 4, Quick: true, Transport: "bus", Duration: 400 * time.Millisecond,
		Fsync: "interval", SkipGrowth: true, SkipProcess: true, SkipVM: true, SkipCluster: true, DatabaseURL: url}
	rep, err := bench.Run(context.Background(), cfg, benchStart, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Raw struct {
			SQLUpsertEPS float64 `json:"sql_upsert_eps"`
		} `json:"raw"`
		Modes []struct {
			Raw struct {
				SQLUpsertEPS float64 `json:"sql_upsert_eps"`
			} `json:"raw"`
		} `json:"modes"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if !(doc.Raw.SQLUpsertEPS > 0) {
		t.Errorf("raw.sql_upsert_eps = %v, want a measured figure", doc.Raw.SQLUpsertEPS)
	}
	for _, m := range doc.Modes {
		if m.Raw.SQLUpsertEPS != doc.Raw.SQLUpsertEPS {
			t.Errorf("a mode's raw.sql_upsert_eps is %v, the report's %v: want the one figure everywhere", m.Raw.SQLUpsertEPS, doc.Raw.SQLUpsertEPS)
		}
	}
	v := rep.SQLView
	if v == nil || !(v.LiveEPS > 0) || !(v.PipelineEPS > 0) || !(v.RebuildEPS > 0) || !(v.RawUpsertRowsPerS > 0) || v.Events == 0 || v.Lag.Max < v.Lag.P99 {
		t.Fatalf("sql view section: %+v, want measured figures", v)
	}
	var out strings.Builder
	rep.Print(&out)
	for _, want := range []string{"raw batched SQL upsert (20 rows/tx + checkpoint): ", "sql view live (fsync interval, bus): ", "sql view rebuild of "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, out.String())
		}
	}
	var sqlTargets []string
	for _, tg := range rep.Targets {
		if strings.Contains(strings.ToLower(tg.Name), "sql") {
			sqlTargets = append(sqlTargets, tg.Name)
		}
	}
	if len(sqlTargets) != 2 {
		t.Errorf("SQL targets %q, want the rebuild's ratio and the live lag", sqlTargets)
	}
}

// TestBenchVM runs the bench's vm section (quick): microVMs booted,
// suspended and resumed through the pipeline, resumed on another node (a
// `torpor driver` beside the service) and back, and the snapshot's bytes.
func TestBenchVM(t *testing.T) {
	vmKernel(t)
	t.Setenv(vm.KernelEnv, vmKernel(t))
	r, err := bench.RunVM(context.Background(), bench.Config{Sandboxes: 1, Concurrency: 1, Quick: true, Transport: "bus", Duration: time.Second}, benchStarter(binary(t)), t.Output())
	if err != nil {
		t.Fatal(err)
	}
	if r.Missing != "" || r.Rounds == 0 || r.Suspend.P50 <= 0 || r.Resume.P50 <= 0 || r.Boot.P50 <= 0 {
		t.Fatalf("vm section: %+v", r)
	}
	t.Logf("vm: suspend p50 %.1f ms, resume p50 %.1f ms, resume on another node p50 %.0f max %.0f ms", r.Suspend.P50, r.Resume.P50, r.Move.P50, r.Move.Max)
	if r.Moves != 2 || r.Move.P50 <= 0 || r.MoveNode == "" {
		t.Fatalf("resumes on another node: %d, p50 %v ms, to %q", r.Moves, r.Move.P50, r.MoveNode)
	}
	if r.ExportAhead.P50 <= 0 {
		t.Fatalf("the snapshots exported ahead of the moves: %+v", r.ExportAhead)
	}
	if r.StateBytes <= 0 || r.MovableBytes <= 0 || r.MovableBytes > int64(r.MemoryMiB)<<20 {
		t.Fatalf("snapshot bytes: state %d, movable %d for %d MiB", r.StateBytes, r.MovableBytes, r.MemoryMiB)
	}
}
