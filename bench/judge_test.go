package bench

import (
	"context"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMedian: the middle of an odd count, whatever the outlier; the mean
// of the two middle figures of an even count; the runs left in the order
// they ran.
func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		vs   []float64
		want float64
	}{
		{"one run", []float64{0.44}, 0.44},
		{"three, one outlier high", []float64{10.0, 215, 27}, 27},
		{"three, one outlier low", []float64{0.52, 0.05, 0.61}, 0.52},
		{"even count", []float64{4, 1, 3, 2}, 2.5},
		{"two", []float64{0.4, 0.6}, 0.5},
		{"five", []float64{5, 1, 4, 2, 3}, 3},
	} {
		vs := slices.Clone(tc.vs)
		if got := median(vs); got != tc.want {
			t.Errorf("%s: median(%v) = %v, want %v", tc.name, tc.vs, got, tc.want)
		}
		if !slices.Equal(vs, tc.vs) {
			t.Errorf("%s: median reordered the runs to %v", tc.name, vs)
		}
	}
	if got := median(nil); !math.IsNaN(got) {
		t.Errorf("median of no runs = %v, want NaN", got)
	}
}

// TestJudgeRunsOnTheMedian: a target is met when the median of its runs
// meets it, whatever one run on either side does; the runs are kept in
// the order they ran, for the spread.
func TestJudgeRunsOnTheMedian(t *testing.T) {
	for _, tc := range []struct {
		name  string
		runs  []float64
		cmp   string
		want  float64
		value float64
		met   bool
	}{
		// The p99 at half busy in four runs of one binary (issue 28).
		{"p99, one run under, two over", []float64{10.0, 27, 78.8}, "<=", 10, 27, false},
		{"p99, one stall in three", []float64{8.1, 215, 9.4}, "<=", 10, 9.4, true},
		{"ratio, one run under", []float64{0.61, 0.44, 0.55}, ">=", 0.5, 0.55, true},
		{"ratio, one run over", []float64{0.46, 0.71, 0.48}, ">=", 0.5, 0.48, false},
		{"even count, middle pair straddles", []float64{0.4, 0.7, 0.45, 0.58}, ">=", 0.5, 0.515, true},
		{"exactly the target", []float64{4, 3, 5}, "<=", 4, 4, true},
	} {
		got := judgeRuns("x", tc.runs, tc.cmp, tc.want)
		if math.Abs(got.Value-tc.value) > 1e-12 || got.Met != tc.met || got.Cmp != tc.cmp || got.Want != tc.want {
			t.Errorf("%s: got value %v met %v, want value %v met %v", tc.name, got.Value, got.Met, tc.value, tc.met)
		}
		if !slices.Equal(got.Runs, tc.runs) {
			t.Errorf("%s: runs %v, want %v in the order they ran", tc.name, got.Runs, tc.runs)
		}
	}
}

// mode is a run of fsync's closed loop over the bus with the figures the
// targets read.
func mode(fsync string, run int, tps, msgs, p99 float64, ratios map[string]float64) Mode {
	return Mode{Fsync: fsync, Run: run, Of: 3, Ratios: ratios,
		Pipeline: Pipeline{Transport: "bus", TransitionsPerS: tps, ServerMsgsPerEvent: msgs},
		Busy:     &Busy{Latency: Latency{Percentiles: Percentiles{Samples: 100, P99: p99}}}}
}

// TestTargetsOfInterleavedRuns: with three runs of each mode, each
// mode's targets are judged on the median of its own runs, the modes'
// closed loops against each other run by run (the k-th of each, which ran
// one after the other), and the report's modes are each mode's median run.
func TestTargetsOfInterleavedRuns(t *testing.T) {
	r := &Report{Ratios: map[string]float64{}, Runs: []Mode{
		mode("interval", 1, 5000, 6.4, 10.0, map[string]float64{"pipeline_vs_bus_floor": 0.45, "http_vs_closed_loop_transitions": 0.92, "http_vs_closed_loop_p50": 1.10}),
		mode("always", 1, 2600, 3.9, 30, map[string]float64{"pipeline_vs_raw_append": 0.52, "http_vs_closed_loop_transitions": 0.95, "http_vs_closed_loop_p50": 1.0}),
		mode("interval", 2, 4000, 3.8, 215, map[string]float64{"pipeline_vs_bus_floor": 0.55, "http_vs_closed_loop_transitions": 0.70, "http_vs_closed_loop_p50": 1.40}),
		mode("always", 2, 1000, 4.1, 20, map[string]float64{"pipeline_vs_raw_append": 0.30, "http_vs_closed_loop_transitions": 0.91, "http_vs_closed_loop_p50": 1.2}),
		mode("interval", 3, 4500, 3.9, 9.0, map[string]float64{"pipeline_vs_bus_floor": 0.60, "http_vs_closed_loop_transitions": 0.95, "http_vs_closed_loop_p50": 1.12}),
		mode("always", 3, 2500, 3.8, 25, map[string]float64{"pipeline_vs_raw_append": 0.51, "http_vs_closed_loop_transitions": 0.90, "http_vs_closed_loop_p50": 1.1}),
	}}
	by := r.runsByMode()
	r.Modes = []Mode{medianMode(by["interval"]), medianMode(by["always"])}
	if got := r.Modes[0]; got.Run != 3 || got.Ratios["pipeline_vs_bus_floor"] != 0.60 || got.RatioMedians["pipeline_vs_bus_floor"] != 0.55 {
		t.Errorf("interval's mode: run %d, floor ratio %v, median %v; want run 3 (4500/s, the middle) with its own 0.60 and the median 0.55",
			got.Run, got.Ratios["pipeline_vs_bus_floor"], got.RatioMedians["pipeline_vs_bus_floor"])
	}
	r.targets()
	got := map[string]Target{}
	for _, tg := range r.Targets {
		got[tg.Name] = tg
	}
	for _, w := range []struct {
		name  string
		value float64
		runs  []float64
		met   bool
	}{
		{"pipeline events/s ÷ bus floor (interval)", 0.55, []float64{0.45, 0.55, 0.60}, true},
		{"p99 ms at 50% of the cores busy (interval)", 10.0, []float64{10.0, 215, 9.0}, true},
		{"server messages per event, closed loop (interval)", 3.9, []float64{6.4, 3.8, 3.9}, true},
		{"server messages per event, closed loop (always)", 3.9, []float64{3.9, 4.1, 3.8}, true},
		{"HTTP closed-loop transitions/s ÷ the bus's (interval)", 0.92, []float64{0.92, 0.70, 0.95}, true},
		{"HTTP closed-loop p50 ÷ the bus's (interval)", 1.12, []float64{1.10, 1.40, 1.12}, true},
		{"HTTP closed-loop transitions/s ÷ the bus's (always)", 0.91, []float64{0.95, 0.91, 0.90}, true},
		{"HTTP closed-loop p50 ÷ the bus's (always)", 1.1, []float64{1.0, 1.2, 1.1}, true},
		{"pipeline events/s ÷ raw async append (always)", 0.51, []float64{0.52, 0.30, 0.51}, true},
		// Paired run by run: 2600/5000, 1000/4000, 2500/4500; the
		// medians' ratio (2500/4500) would be another figure.
		{"closed-loop transitions/s, fsync always ÷ interval (bus)", 0.52, []float64{0.52, 0.25, 2500.0 / 4500}, true},
	} {
		tg, ok := got[w.name]
		if !ok {
			t.Errorf("no target %q", w.name)
			continue
		}
		if math.Abs(tg.Value-w.value) > 1e-12 || tg.Met != w.met || !slices.EqualFunc(tg.Runs, w.runs, func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }) {
			t.Errorf("%s: value %v met %v runs %v; want %v met %v runs %v", w.name, tg.Value, tg.Met, tg.Runs, w.value, w.met, w.runs)
		}
	}
	if len(r.Targets) != 10 {
		t.Errorf("%d targets, want the 10 above", len(r.Targets))
	}
}

// TestMedianRun: the run at the middle by its key; the lower middle one
// of an even count.
func TestMedianRun(t *testing.T) {
	runs := []ReplayRun{{RawOrderedReadEPS: 100, KVRebuildEPS: 60}, {RawOrderedReadEPS: 100, KVRebuildEPS: 20}, {RawOrderedReadEPS: 200, KVRebuildEPS: 90}}
	ratio := func(r ReplayRun) float64 { return r.KVRebuildEPS / r.RawOrderedReadEPS }
	if got := medianRun(runs, ratio); got != runs[2] {
		t.Errorf("median run %+v, want %+v (0.45, between 0.2 and 0.6)", got, runs[2])
	}
	if got := medianRun(runs[:2], ratio); got != runs[1] {
		t.Errorf("median of two %+v, want the lower %+v", got, runs[1])
	}
}

// TestBlockP99s: the freezers' cycles (and the vm rounds) split, in the
// order they ran, into runs of about equal length, each with its own p99
// (p50); a stall in one block is that block's.
func TestBlockP99s(t *testing.T) {
	var ds []time.Duration
	for i := range 300 {
		d := time.Millisecond
		if i >= 100 && i < 105 { // five slow cycles in the second block
			d = 50 * time.Millisecond
		}
		ds = append(ds, d)
	}
	got := blockP99s(ds, 3)
	if want := []float64{1, 50, 1}; !slices.Equal(got, want) {
		t.Errorf("p99s %v, want %v", got, want)
	}
	if ds[100] != 50*time.Millisecond {
		t.Error("blockP99s reordered the cycles")
	}
	for i := 200; i < 260; i++ { // most of the third block slow
		ds[i] = 20 * time.Millisecond
	}
	if got, want := blockP50s(ds, 3), []float64{1, 1, 20}; !slices.Equal(got, want) {
		t.Errorf("p50s %v, want %v", got, want)
	}
	if got := blockP99s(ds[:2], 3); len(got) != 2 {
		t.Errorf("two cycles in three runs: %v, want two runs of one", got)
	}
}

// todaysTargets are target lines of BENCHMARKS.md as the bench printed
// them before its judgements were medians.
const todaysTargets = "```\n" +
	"ran 250s\n" +
	"target HTTP closed-loop transitions/s ÷ the bus's (interval)                   0.745 >= 0.8      MISSED (at 93% of the target)\n" +
	"target p99 ms at 50% of the cores busy (interval)                             10.036 <= 10       MISSED (at 100% of the target)\n" +
	"target heap bytes per idle sandbox                                          1736.345 <= 2048     met\n" +
	"target restart to ready with 100000 sandboxes (s)                              1.157 <= 3        met\n" +
	"target vm resume→ready p50 ms, on another node (tcg, 128 MiB)               1053.992 <= 2000     met\n" +
	"target vm movable snapshot of an idle guest ÷ its memory                       0.116 <= 0.25     met\n" +
	"```\n- **targets**: pipeline events/s at least half the bus floor\n"

// TestParseTargets reads today's BENCHMARKS.md target lines, and the
// lines Print writes now (with their runs) back into the targets they
// were printed from.
func TestParseTargets(t *testing.T) {
	got, err := ParseTargets(strings.NewReader(todaysTargets))
	if err != nil {
		t.Fatal(err)
	}
	want := []Target{
		{Name: "HTTP closed-loop transitions/s ÷ the bus's (interval)", Value: 0.745, Cmp: ">=", Want: 0.8},
		{Name: "p99 ms at 50% of the cores busy (interval)", Value: 10.036, Cmp: "<=", Want: 10},
		{Name: "heap bytes per idle sandbox", Value: 1736.345, Cmp: "<=", Want: 2048, Met: true},
		{Name: "restart to ready with 100000 sandboxes (s)", Value: 1.157, Cmp: "<=", Want: 3, Met: true},
		{Name: "vm resume→ready p50 ms, on another node (tcg, 128 MiB)", Value: 1053.992, Cmp: "<=", Want: 2000, Met: true},
		{Name: "vm movable snapshot of an idle guest ÷ its memory", Value: 0.116, Cmp: "<=", Want: 0.25, Met: true},
	}
	if !slices.EqualFunc(got, want, sameTarget) {
		t.Errorf("parsed\n%+v\nwant\n%+v", got, want)
	}

	printed := []Target{
		judgeRuns("pipeline events/s ÷ bus floor (interval)", []float64{0.412, 0.533, 0.501}, ">=", 0.5),
		judgeRuns("p99 ms at 50% of the cores busy (interval)", []float64{27, 10, 78.8}, "<=", 10),
		judgeRuns("heap bytes per idle sandbox", []float64{1736.345}, "<=", 2048),
		judgeRuns("restart to ready with 100000 sandboxes (s)", []float64{1, 2, 1.5, 1.2, 1.1, 3.25}, "<=", 3),
	}
	var text strings.Builder
	for _, tg := range printed {
		text.WriteString(tg.line() + "\n")
	}
	back, err := ParseTargets(strings.NewReader(text.String()))
	if err != nil {
		t.Fatal(err)
	}
	printed[3].Runs = []float64{1, 3.25} // beyond five runs, the least and the greatest
	if !slices.EqualFunc(back, printed, sameTarget) {
		t.Errorf("read back\n%+v\nfrom\n%s\nwant\n%+v", back, text.String(), printed)
	}

	if _, err := ParseTargets(strings.NewReader("target something without a figure\n")); err == nil {
		t.Error("a target line that does not read was skipped, not refused")
	}
	// The file itself, whatever its figures are by now.
	f, err := os.Open("../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if ts, err := ParseTargets(f); err != nil || len(ts) < 10 {
		t.Errorf("BENCHMARKS.md: %d targets, %v; want its every target line read", len(ts), err)
	}
}

// sameTarget compares two targets to the printed precision.
func sameTarget(a, b Target) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) < 5e-4 }
	return a.Name == b.Name && near(a.Value, b.Value) && a.Cmp == b.Cmp && a.Want == b.Want && a.Met == b.Met &&
		slices.EqualFunc(a.Runs, b.Runs, near)
}

// TestChanges: each target of this run beside the one of the same name
// before, in this run's order; a new target and one no longer judged say
// so; a moved target is shown beside each figure.
func TestChanges(t *testing.T) {
	before, err := ParseTargets(strings.NewReader(todaysTargets))
	if err != nil {
		t.Fatal(err)
	}
	now := []Target{
		judgeRuns("p99 ms at 50% of the cores busy (interval)", []float64{9, 8, 30}, "<=", 10),
		judgeRuns("HTTP closed-loop transitions/s ÷ the bus's (interval)", []float64{0.93, 0.95, 0.91}, ">=", 0.9),
		judgeRuns("server messages per event, closed loop (interval)", []float64{3.5, 3.6, 3.7}, "<=", 4),
	}
	var got []string
	for _, c := range changes(before, now) {
		got = append(got, c.String())
	}
	want := []string{
		"p99 ms at 50% of the cores busy (interval): 10.036 MISSED → 9.000 met (×0.90)",
		"HTTP closed-loop transitions/s ÷ the bus's (interval): 0.745 (>= 0.8) MISSED → 0.930 (>= 0.9) met (×1.25)",
		"server messages per event, closed loop (interval): new, 3.600 (<= 4) met",
		"heap bytes per idle sandbox: 1736.345 (<= 2048) met, not judged in this run",
		"restart to ready with 100000 sandboxes (s): 1.157 (<= 3) met, not judged in this run",
		"vm resume→ready p50 ms, on another node (tcg, 128 MiB): 1053.992 (<= 2000) met, not judged in this run",
		"vm movable snapshot of an idle guest ÷ its memory: 0.116 (<= 0.25) met, not judged in this run",
	}
	if !slices.Equal(got, want) {
		t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestGrowthLatencyRuns: the growth target's runs are the k-th steady run
// at the largest size over the k-th at the smallest; rows measured in one
// run give the ratio of their p50s.
func TestGrowthLatencyRuns(t *testing.T) {
	g := &Growth{Rows: []GrowthRow{
		{Sandboxes: 1000, SteadyP50Runs: []float64{2, 4, 2.5}, Steady: Latency{Percentiles: Percentiles{P50: 2.4}}},
		{Sandboxes: 100_000, SteadyP50Runs: []float64{9, 9, 9}},
		{Sandboxes: 100_000, EventsPerSandbox: 1000, SteadyP50Runs: []float64{2, 2, 5}, Steady: Latency{Percentiles: Percentiles{P50: 3}}},
	}}
	if got, want := g.latencyRuns(), []float64{1, 0.5, 2}; !slices.Equal(got, want) {
		t.Errorf("runs %v, want %v", got, want)
	}
	r := &Report{Growth: g, Ratios: map[string]float64{}}
	r.targets()
	if len(r.Targets) == 0 || r.Targets[0].Value != 1 || !r.Targets[0].Met {
		t.Errorf("targets %+v, want the latency target judged on the median ratio 1", r.Targets)
	}
	for i := range g.Rows {
		g.Rows[i].SteadyP50Runs = nil
	}
	if got, want := g.latencyRuns(), []float64{1.25}; !slices.Equal(got, want) {
		t.Errorf("rows without runs: %v, want %v", got, want)
	}
}

// TestReplayTarget: the rebuild target is the median of each run's
// rebuild ÷ the read right before it, not of the medians' ratio.
func TestReplayTarget(t *testing.T) {
	r := &Report{Ratios: map[string]float64{}, Replay: &Replay{Runs: []ReplayRun{
		{RawOrderedReadEPS: 100, KVRebuildEPS: 40},
		{RawOrderedReadEPS: 50, KVRebuildEPS: 30},
		{RawOrderedReadEPS: 200, KVRebuildEPS: 90},
	}}}
	r.targets()
	if len(r.Targets) != 1 {
		t.Fatalf("targets %+v, want the rebuild's", r.Targets)
	}
	// Each run's: 0.4, 0.6, 0.45; the medians' (45 ÷ 100) would be 0.45
	// too, so the runs are what tells them apart.
	if tg := r.Targets[0]; tg.Value != 0.45 || tg.Met || !slices.Equal(tg.Runs, []float64{0.4, 0.6, 0.45}) {
		t.Errorf("target %+v, want 0.45 (missed) of the runs 0.4 0.6 0.45", tg)
	}
}

// TestHalfBusy: the rate of the latency-at-half-busy figure. Where the
// cores bound the rate (each transition 1 ms of CPU on 2 cores, capacity
// 1800/s) it is found where the cores are 45-50% busy; where something else
// does (the log's syncs: 0.1 ms of CPU, capacity 1000/s) the cores never
// get half busy, and the rate stops at half the capacity, said so, rather
// than at the capacity, where commands queue.
func TestHalfBusy(t *testing.T) {
	for _, tc := range []struct {
		name              string
		cpuMs, capacity   float64
		wantLow, wantHigh float64
		wantCapped        bool
	}{
		{"the cores bound it", 1, 1800, 900, 1000, false},
		{"the syncs bound it", 0.1, 1000, 500, 500, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(_ context.Context, rate float64, _ time.Duration) (Latency, error) {
				return Latency{OfferedPerS: rate, CoresBusy: rate * tc.cpuMs / 1000 / 2}, nil
			}
			// The closed loop's run, at its capacity.
			b, err := halfBusy(context.Background(), run, tc.capacity, tc.capacity*tc.cpuMs/1000/2, tc.capacity, time.Second, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if b.OfferedPerS < tc.wantLow || b.OfferedPerS > tc.wantHigh || b.Capped != tc.wantCapped {
				t.Errorf("offered %.0f/s, capped %v; want %.0f-%.0f/s, capped %v", b.OfferedPerS, b.Capped, tc.wantLow, tc.wantHigh, tc.wantCapped)
			}
		})
	}
}
