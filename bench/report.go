package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// Mode is one durability mode's run.
type Mode struct {
	Fsync    string   `json:"fsync"`
	Raw      Raw      `json:"raw"`
	Pipeline Pipeline `json:"pipeline"`
	Latency  Latency  `json:"latency_ms"`
	// Busy is the latency at the rate that keeps the cores half busy,
	// which the p99 target is judged on; nil where no CPU time is read.
	Busy   *Busy              `json:"latency_at_50pct_busy_ms,omitempty"`
	HTTP   HTTPLoop           `json:"http_closed_loop"`
	Ratios map[string]float64 `json:"ratios"`
	// RatioMedians, in a report's modes, are the medians of each ratio
	// over the mode's runs, where it ran more than once.
	RatioMedians map[string]float64 `json:"ratio_medians,omitempty"`
	// Run is this run's place among the Of runs of its mode (--runs),
	// which alternate with the other mode's.
	Run int `json:"run,omitempty"`
	Of  int `json:"of,omitempty"`
}

// label names m in Print's lines: its mode, and its run where there were
// several.
func (m Mode) label() string {
	if m.Of > 1 {
		return fmt.Sprintf("%s %d/%d", m.Fsync, m.Run, m.Of)
	}
	return m.Fsync
}

// Target is one target checked against this run: met when Value, the
// median of the figure's Runs, compares to Want by Cmp (">=" or "<=").
type Target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	// Runs is the figure in each run that measured it, in the order they
	// ran (see judgeRuns).
	Runs []float64 `json:"runs,omitempty"`
	Cmp  string    `json:"cmp"`
	Want float64   `json:"want"`
	Met  bool      `json:"met"`
}

// Report is the JSON document of `torpor bench -o json`. Each of modes is
// the median run of its fsync mode (by closed-loop transitions/s), with the
// medians of the ratios over every run of the mode (ratio_medians); runs
// holds every run as it ran. The top-level raw, pipeline, latency_ms and
// http_closed_loop are the primary mode's median run's (interval when it
// ran), the top-level ratios its medians.
type Report struct {
	Machine  map[string]any `json:"machine"`
	Config   map[string]any `json:"config"`
	Modes    []Mode         `json:"modes"`
	Runs     []Mode         `json:"runs"`
	Raw      Raw            `json:"raw"`
	Pipeline Pipeline       `json:"pipeline"`
	Latency  Latency        `json:"latency_ms"`
	Busy     *Busy          `json:"latency_at_50pct_busy_ms,omitempty"`
	HTTP     HTTPLoop       `json:"http_closed_loop"`
	Growth   *Growth        `json:"growth,omitempty"`
	Replay   *Replay        `json:"replay,omitempty"`
	Process  *Process       `json:"process,omitempty"`
	Wake     *Wake          `json:"wake,omitempty"`
	WakeVM   *Wake          `json:"wake_vm,omitempty"` // RunVMWake
	VM       *VM            `json:"vm,omitempty"`
	SQLView  *SQLView       `json:"sql_view,omitempty"`
	// Cluster is the closed loop on a three-server cluster, R3, in the
	// primary mode (absent with --skip-cluster).
	Cluster *Cluster           `json:"cluster,omitempty"`
	Ratios  map[string]float64 `json:"ratios"`
	Targets []Target           `json:"targets"`
	// Changes holds each target next to the same one in the report
	// ComparedWith names (--compare), where one was given.
	Changes      []Change `json:"changes,omitempty"`
	ComparedWith string   `json:"compared_with,omitempty"`
	Notes        []string `json:"notes"`
	Seconds      float64  `json:"seconds"`
}

// targets checks the targets against what this run measured, each on the
// median of its runs: per fsync mode the closed loop over HTTP against the
// bus's and its server messages per event, the pipeline against the bus
// floor (interval) and against the raw async append (always), the p99 at
// half the cores busy (interval); the two modes' closed loops against each
// other; then the sections that run once.
func (r *Report) targets() {
	add := func(name string, runs []float64, cmp string, want float64) {
		if len(runs) > 0 {
			r.Targets = append(r.Targets, judgeRuns(name, runs, cmp, want))
		}
	}
	one := func(v float64, ok bool) []float64 {
		if !ok {
			return nil
		}
		return []float64{v}
	}
	byMode := r.runsByMode()
	for _, m := range r.Modes {
		runs := byMode[m.Fsync]
		ratio := func(k string) []float64 {
			var vs []float64
			for _, run := range runs {
				if v, ok := run.Ratios[k]; ok {
					vs = append(vs, v)
				}
			}
			return vs
		}
		// Issue 15, raised by issue 28: HTTP as users drive it keeps up
		// with the bus at the same clients, in the same runs.
		if m.Pipeline.Transport == "bus" {
			add(fmt.Sprintf("HTTP closed-loop transitions/s ÷ the bus's (%s)", m.Fsync), ratio("http_vs_closed_loop_transitions"), ">=", 0.9)
			add(fmt.Sprintf("HTTP closed-loop p50 ÷ the bus's (%s)", m.Fsync), ratio("http_vs_closed_loop_p50"), "<=", 1.15)
		}
		var msgs []float64
		for _, run := range runs {
			if v := run.Pipeline.ServerMsgsPerEvent; v > 0 {
				msgs = append(msgs, v)
			}
		}
		add(fmt.Sprintf("server messages per event, closed loop (%s)", m.Fsync), msgs, "<=", 4)
		switch m.Fsync {
		case "interval":
			add("pipeline events/s ÷ bus floor (interval)", ratio("pipeline_vs_bus_floor"), ">=", 0.5)
			var p99 []float64
			for _, run := range runs {
				if b := run.Busy; b != nil && b.Samples > 0 {
					p99 = append(p99, b.P99)
				}
			}
			add("p99 ms at 50% of the cores busy (interval)", p99, "<=", 10)
		case "always":
			add("pipeline events/s ÷ raw async append (always)", ratio("pipeline_vs_raw_append"), ">=", 0.5)
		}
	}
	if v := r.alwaysVsInterval(); len(v) > 0 {
		add("closed-loop transitions/s, fsync always ÷ interval (bus)", v, ">=", 0.5)
	}
	if g := r.Growth; g != nil {
		add("command latency, largest fleet & longest history ÷ smallest (p50)", g.latencyRuns(), "<=", 1.25)
		add("heap bytes per idle sandbox", one(g.HeapPerSandboxBytes, g.HeapPerSandboxBytes > 0), "<=", 2048)
		recovery := g.RecoveryRuns
		if len(recovery) == 0 {
			recovery = one(g.RecoverySeconds, g.RecoverySeconds > 0)
		}
		add(fmt.Sprintf("restart to ready with %d sandboxes (s)", g.RecoverySandboxes), recovery, "<=", 3)
	}
	if rp := r.Replay; rp != nil {
		add("KV rebuild ÷ raw ordered read", rp.ratioRuns(), ">=", 0.5)
	}
	if v := r.SQLView; v != nil {
		ratio, ok := r.Ratios["sql_rebuild_vs_raw_upsert"]
		add("SQL rebuild events/s ÷ raw batched upsert rows/s", one(ratio, ok), ">=", 0.5)
		add("live SQL view lag p99 ms at the pipeline's closed-loop rate", one(v.Lag.P99, v.LiveEPS > 0), "<=", 1000)
	}
	if p := r.Process; p != nil {
		for _, f := range p.Freezers {
			freeze, thaw := f.FreezeP99Runs, f.ThawP99Runs
			if len(freeze) == 0 {
				freeze, thaw = one(f.Freeze.P99, f.Cycles > 0), one(f.Thaw.P99, f.Cycles > 0)
			}
			add(fmt.Sprintf("process group freeze p99 ms (%s)", f.Freezer), freeze, "<=", 10)
			add(fmt.Sprintf("process group thaw p99 ms (%s)", f.Freezer), thaw, "<=", 10)
		}
	}
	if v := r.VM; v != nil && v.Missing == "" {
		runs := func(vs []float64, p50 float64, ok bool) []float64 {
			if len(vs) > 0 {
				return vs
			}
			return one(p50, ok)
		}
		// Issue 29's targets (TCG, 128 MiB): suspend 30 ms, resume on the
		// same node 50 ms, on another node 500 ms (the export ahead not
		// counted: it runs after suspended).
		add(fmt.Sprintf("vm suspend→suspended p50 ms, same node (%s, %d MiB)", v.Accel, v.MemoryMiB), runs(v.SuspendP50Runs, v.Suspend.P50, v.Rounds > 0), "<=", 30)
		add(fmt.Sprintf("vm resume→ready p50 ms, same node (%s, %d MiB)", v.Accel, v.MemoryMiB), runs(v.ResumeP50Runs, v.Resume.P50, v.Rounds > 0), "<=", 50)
		add(fmt.Sprintf("vm resume→ready p50 ms, on another node (%s, %d MiB)", v.Accel, v.MemoryMiB), runs(v.MoveP50Runs, v.Move.P50, v.Moves > 0), "<=", 500)
		add("vm movable snapshot of an idle guest ÷ its memory", one(float64(v.MovableBytes)/float64(int64(v.MemoryMiB)<<20), v.MovableBytes > 0), "<=", 0.25)
	}
}

// runsByMode is every run of each fsync mode, in the order they ran; a
// report without runs (one assembled by hand) has its modes as its runs.
func (r *Report) runsByMode() map[string][]Mode {
	runs := r.Runs
	if len(runs) == 0 {
		runs = r.Modes
	}
	by := map[string][]Mode{}
	for _, m := range runs {
		by[m.Fsync] = append(by[m.Fsync], m)
	}
	return by
}

// alwaysVsInterval is, for each pair of runs of the two modes (the k-th of
// each, which ran one after the other), the closed loop's transitions/s
// with fsync always over those with fsync interval; none unless both modes
// ran over the bus.
func (r *Report) alwaysVsInterval() []float64 {
	by := r.runsByMode()
	iv, al := by["interval"], by["always"]
	var vs []float64
	for k := range min(len(iv), len(al)) {
		a, i := al[k].Pipeline, iv[k].Pipeline
		if a.Transport == "bus" && i.Transport == "bus" && i.TransitionsPerS > 0 {
			vs = append(vs, a.TransitionsPerS/i.TransitionsPerS)
		}
	}
	return vs
}

// Compare sets the changes of this report's targets against before, the
// targets of the report at name (ParseTargets).
func (r *Report) Compare(name string, before []Target) {
	r.Changes, r.ComparedWith = changes(before, r.Targets), name
}

// Print writes the report as tables, with the gap of every target missed.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "torpor bench — %v CPUs, %s, %s; transport %s, %d sandboxes, %d clients\n\n", r.Machine["cpus"], r.Machine["go"], r.Machine["os"], r.Pipeline.Transport, r.Pipeline.Sandboxes, r.Pipeline.Concurrency)
	fmt.Fprintln(tw, "fsync\traw sync append/s\traw async append/s\traw ordered read/s\traw KV put/s\tpipeline events/s\ttransitions/s\tratio\tp50 ms\tp90 ms\tp99 ms\tmax ms\traw append p50 ms\traw append p99 ms\t")
	rows := r.Runs
	if len(rows) == 0 {
		rows = r.Modes
	}
	for _, m := range rows {
		var rl Latency
		if m.Raw.AppendLatency != nil {
			rl = *m.Raw.AppendLatency
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", m.label(), m.Raw.AppendCheckSyncEPS, m.Raw.AppendCheckAsyncEPS,
			m.Raw.OrderedReadEPS, m.Raw.KVPutEPS, m.Pipeline.EventsPerS, m.Pipeline.TransitionsPerS, m.Ratios["pipeline_vs_raw_append"],
			m.Latency.P50, m.Latency.P90, m.Latency.P99, m.Latency.Max, rl.P50, rl.P99)
	}
	tw.Flush()
	if len(rows) > len(r.Modes) {
		fmt.Fprintf(w, "%d runs of each mode, the modes alternating (a row each, in the order they ran); below, each mode's median run by closed-loop transitions/s; the targets are judged on the medians of every run's figures\n", rows[0].Of)
	}
	for _, m := range r.Modes {
		if m.Raw.BusFloorEPS > 0 {
			fmt.Fprintf(w, "bus floor (%s): %.0f events/s = %.2f of raw async; the pipeline runs at %.2f of it\n", m.Fsync, m.Raw.BusFloorEPS,
				m.Ratios["bus_floor_vs_raw_append"], m.Ratios["pipeline_vs_bus_floor"])
		}
	}
	for _, m := range r.Modes {
		p, h := m.Pipeline, m.HTTP
		fmt.Fprintf(w, "closed loop (%s): over %s %.0f transitions/s, p50 %.2f p99 %.2f ms; over HTTP with ?wait=true %.0f transitions/s, p50 %.2f p99 %.2f ms: %.2f of the transitions/s, %.2f× the p50\n",
			m.Fsync, p.Transport, p.TransitionsPerS, p.P50, p.P99, h.TransitionsPerS, h.P50, h.P99,
			m.Ratios["http_vs_closed_loop_transitions"], m.Ratios["http_vs_closed_loop_p50"])
	}
	if r.Cluster != nil {
		fmt.Fprintln(w)
		r.printCluster(w)
		fmt.Fprintln(w)
	}
	for _, m := range r.Modes {
		h, b := m.Raw.HTTPRoundTrip, m.Raw.BusRequest
		if h == nil || b == nil {
			continue
		}
		fmt.Fprintf(w, "round trips (%s, %d clients, no work either side): raw HTTP %.0f/s, %.1f µs CPU each; raw bus request %.0f/s, %.1f µs CPU each", m.Fsync, h.Concurrency, h.PerS, h.CPUMicros, b.PerS, b.CPUMicros)
		if c, ok := m.Ratios["http_ceiling_vs_closed_loop_per_cpu"]; ok {
			fmt.Fprintf(w, "; per CPU second the closed loop over HTTP made %.2f of the bus's transitions, where one bare round trip (the command with ?wait=true) for the bus's one request leaves room for %.2f", m.Ratios["http_vs_closed_loop_per_cpu"], c)
		}
		fmt.Fprintln(w)
	}
	for _, m := range r.Modes {
		fmt.Fprintf(w, "cost (%s): closed loop %.2f ms CPU per transition, %.0f%% of the cores busy, %.1f server messages per event (a raw append: 2); over HTTP %.2f ms, %.0f%% busy; open loop at %.0f/s %.2f ms per transition, %.0f%% busy\n",
			m.Fsync, m.Pipeline.CPUMsPerTransition, 100*m.Pipeline.CoresBusy, m.Pipeline.ServerMsgsPerEvent, m.HTTP.CPUMsPerTransition, 100*m.HTTP.CoresBusy,
			m.Latency.OfferedPerS, m.Latency.CPUMsPerTransition, 100*m.Latency.CoresBusy)
	}
	for _, m := range r.Modes {
		if h := m.Latency.Host; h != nil {
			fmt.Fprintf(w, "host (%s): during the latency figure run the machine ran slow (a %.0fµs chunk of arithmetic taking %d× its CPU time or more) for about %.0f ms in %d episodes, at worst %.0f× (closed loop: %s)\n",
				m.Fsync, h.ChunkUS, probeSlow, h.SlowMS, h.Episodes, h.WorstX, m.Pipeline.Host.brief())
		}
	}
	for _, m := range r.Modes {
		b := m.Busy
		if b == nil {
			continue
		}
		var steps []string
		for _, c := range b.Calibration {
			steps = append(steps, fmt.Sprintf("%.0f/s %.0f%%", c.OfferedPerS, 100*c.CoresBusy))
		}
		worst := ""
		if b.Host != nil {
			worst = fmt.Sprintf(", at worst %.0f×", b.Host.WorstX)
		}
		skipped := ""
		if b.Skipped > 0 {
			skipped = fmt.Sprintf(", %d of %d skipped (no sandbox idle)", b.Skipped, b.Offered)
		}
		if b.Capped {
			skipped += "; the rate capped at half the closed loop's, the cores not half busy below it"
		}
		fmt.Fprintf(w, "latency at 50%% busy (%s): %.0f transitions/s offered (calibration runs: %s busy), p50 %.2f p90 %.2f p99 %.2f max %.2f ms%s; %.0f%% of the cores busy, %.2f ms CPU per transition; host: %s%s\n",
			m.Fsync, b.OfferedPerS, strings.Join(steps, ", "), b.P50, b.P90, b.P99, b.Max, skipped, 100*b.CoresBusy, b.CPUMsPerTransition, b.Host.brief(), worst)
	}
	for _, m := range r.Modes {
		var parts []string
		for _, verb := range []string{"suspend", "resume"} {
			if l := m.Latency.ByVerb[verb]; l != nil {
				parts = append(parts, fmt.Sprintf("%s p50 %.2f p90 %.2f p99 %.2f ms", verb, l.P50, l.P90, l.P99))
			}
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, "latency by command (%s): %s\n", m.Fsync, strings.Join(parts, "; "))
		}
	}
	if v := r.Raw.SQLUpsertEPS; v != nil {
		fmt.Fprintf(w, "raw batched SQL upsert (%v rows/tx + checkpoint): %.0f rows/s\n", r.Config["sql_rows_per_tx"], *v)
	}
	if g := r.Growth; g != nil {
		fmt.Fprintln(w)
		fmt.Fprintln(tw, "sandboxes\tevents/sandbox\tlog events\tfirst touch p50 ms\tsteady p50 ms\tsteady p99 ms\t")
		for _, row := range g.Rows {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t\n", row.Sandboxes, row.EventsPerSandbox, row.LogEvents, row.FirstTouch.P50, row.Steady.P50, row.Steady.P99)
		}
		tw.Flush()
		fmt.Fprintf(w, "live view catch-up %.0f events/s; heap %.0f B per idle sandbox; restart to ready with %d sandboxes %.2fs\n", g.CatchUpEPS, g.HeapPerSandboxBytes, g.RecoverySandboxes, g.RecoverySeconds)
	}
	if rp := r.Replay; rp != nil {
		runs := ""
		if len(rp.Runs) > 1 {
			runs = fmt.Sprintf(" (the median run of %d by rebuild ÷ read, each after a restart; every run's ratio in its target)", len(rp.Runs))
		}
		fmt.Fprintf(w, "replay of %d events: raw ordered read %.0f/s, KV rebuild %.0f/s%s\n", rp.Events, rp.RawOrderedReadEPS, rp.KVRebuildEPS, runs)
	}
	if p := r.Process; p != nil {
		fmt.Fprintln(w)
		fmt.Fprintln(tw, "process freezer\tcycles\tfreeze p50 ms\tfreeze p99 ms\tfreeze max ms\tthaw p50 ms\tthaw p99 ms\tthaw max ms\t")
		for _, f := range p.Freezers {
			if f.Cycles == 0 {
				continue
			}
			fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t\n", f.Freezer, f.Cycles, f.Freeze.P50, f.Freeze.P99, f.Freeze.Max, f.Thaw.P50, f.Thaw.P99, f.Thaw.Max)
		}
		tw.Flush()
		for _, f := range p.Freezers {
			if f.Missing != "" {
				fmt.Fprintf(w, "freezer %s: not here (%s)\n", f.Freezer, f.Missing)
			}
		}
		fmt.Fprintf(w, "process sandboxes through the pipeline (%d × %d rounds, over HTTP with the SDK's wait): suspend→suspended p50 %.2f p90 %.2f p99 %.2f max %.2f ms; resume→ready p50 %.2f p90 %.2f p99 %.2f max %.2f ms\n",
			p.Sandboxes, p.Rounds, p.Suspend.P50, p.Suspend.P90, p.Suspend.P99, p.Suspend.Max, p.Resume.P50, p.Resume.P90, p.Resume.P99, p.Resume.Max)
		if len(p.ResumeStages) > 0 {
			fmt.Fprintln(w, stageLine("process resume latency, same node", p.ResumeStages))
		}
	}
	if wk := r.Wake; wk != nil {
		if wk.Missing != "" {
			fmt.Fprintf(w, "wake on traffic: not here (%s)\n", wk.Missing)
		} else {
			fmt.Fprintf(w, "wake on traffic, a process sandbox, same node (%d wakes, a GET through its forward): connect→first byte of the answer p50 %.2f p99 %.2f max %.2f ms\n",
				wk.Rounds, wk.Latency.P50, wk.Latency.P99, wk.Latency.Max)
		}
	}
	if wk := r.WakeVM; wk != nil {
		if wk.Missing != "" {
			fmt.Fprintf(w, "wake on traffic, a vm sandbox: not here (%s)\n", wk.Missing)
		} else {
			fmt.Fprintf(w, "wake on traffic, a vm sandbox (%s), same node (%d wakes, a GET through its forward): connect→first byte of the answer p50 %.2f p99 %.2f max %.2f ms\n",
				wk.Accel, wk.Rounds, wk.Latency.P50, wk.Latency.P99, wk.Latency.Max)
		}
	}
	if v := r.SQLView; v != nil {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "sql view live (fsync interval, bus): the pipeline appended %.0f events/s, the SQL view applied %.0f/s; lag p50 %.0f p90 %.0f p99 %.0f max %.0f ms\n",
			v.PipelineEPS, v.LiveEPS, v.Lag.P50, v.Lag.P90, v.Lag.P99, v.Lag.Max)
		fmt.Fprintf(w, "sql view rebuild of %d events: %.0f events/s (%.1f s); raw batched upsert %.0f rows/s: %.2f of it\n",
			v.Events, v.RebuildEPS, v.RebuildSeconds, v.RawUpsertRowsPerS, r.Ratios["sql_rebuild_vs_raw_upsert"])
	}
	if v := r.VM; v != nil {
		fmt.Fprintln(w)
		if v.Missing != "" {
			fmt.Fprintf(w, "vm: not measured here (%s)\n", v.Missing)
		} else {
			fmt.Fprintf(w, "vm sandboxes (%s, %d MiB) through the pipeline (%d × %d rounds, over HTTP with the SDK's wait): boot→ready p50 %.0f max %.0f ms; suspend→suspended p50 %.2f p90 %.2f p99 %.2f max %.2f ms; resume→ready p50 %.2f p90 %.2f p99 %.2f max %.2f ms\n",
				v.Accel, v.MemoryMiB, v.Sandboxes, v.Rounds, v.Boot.P50, v.Boot.Max, v.Suspend.P50, v.Suspend.P90, v.Suspend.P99, v.Suspend.Max, v.Resume.P50, v.Resume.P90, v.Resume.P99, v.Resume.Max)
			fmt.Fprintf(w, "vm resume on another node (%d resumes, to %s and back; the snapshot exported ahead, the fetch and restore included): resume→ready p50 %.0f p90 %.0f max %.0f ms\n",
				v.Moves, v.MoveNode, v.Move.P50, v.Move.P90, v.Move.Max)
			if len(v.ResumeStages) > 0 {
				fmt.Fprintln(w, stageLine(fmt.Sprintf("vm resume latency, same node (%s)", v.Accel), v.ResumeStages))
			}
			if len(v.MoveStages) > 0 {
				fmt.Fprintln(w, stageLine(fmt.Sprintf("vm resume latency, on another node (%s)", v.Accel), v.MoveStages))
			}
			if v.AccelWhy != "" {
				fmt.Fprintf(w, "vm accelerator of every vm row: %s (%s)\n", v.Accel, v.AccelWhy)
			}
			if v.ExportAhead.P50 > 0 {
				fmt.Fprintf(w, "vm export ahead (after each suspension, in the background; waited for before each resume on another node and not counted in it): suspended→movable p50 %.0f p90 %.0f max %.0f ms\n",
					v.ExportAhead.P50, v.ExportAhead.P90, v.ExportAhead.Max)
			}
			fmt.Fprintf(w, "vm snapshot bytes per MiB of guest memory: same node %.0f (device state only; the RAM stays in the node's file), movable %.0f (compressed, in torpor_snapshots)\n",
				float64(v.StateBytes)/float64(v.MemoryMiB), float64(v.MovableBytes)/float64(v.MemoryMiB))
		}
	}
	fmt.Fprintln(w)
	for _, t := range r.Targets {
		fmt.Fprintln(w, t.line())
	}
	if len(r.Changes) > 0 {
		fmt.Fprintf(w, "\nwhat changed against %s:\n", r.ComparedWith)
		for _, c := range r.Changes {
			fmt.Fprintln(w, " ", c)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", strings.TrimSpace(n))
	}
	fmt.Fprintf(w, "\nran %.0fs\n", r.Seconds)
}

// Markdown writes BENCHMARKS.md: the machine, the exact command, the tables.
func (r *Report) Markdown(w io.Writer, command string) {
	cpu := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	fmt.Fprintf(w, "# torpor benchmarks\n\nGenerated by `task benchmarks` (`%s`) on %s.\n\n", command, time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(w, "Machine: %v CPUs (%s), %s, %s. Every figure below was measured in this one run; the\n", r.Machine["cpus"], cpu, r.Machine["go"], r.Machine["os"])
	fmt.Fprintf(w, "ratios compare the pipeline with the raw bus measured on the same embedded server in the same run.\n\n")
	fmt.Fprintln(w, "```")
	r.Print(w)
	fmt.Fprintln(w, "```")
	fmt.Fprint(w, benchmarksNotes)
}

// benchmarksNotes explains the figures in BENCHMARKS.md.
const benchmarksNotes = `
## Reading the figures

- **raw**: JetStream appends with the expected-last-subject-sequence check (one publisher
  waiting for each ack; an async window of --concurrency publishes over --sandboxes
  subjects), an ordered-consumer read of what was written, KV puts from --concurrency writers.
- **raw batched SQL upsert** (with --database-url): one writer upserting phase-view rows
  over --sandboxes keys, up to 500 rows a transaction with a checkpoint row, through
  cockroach-go's retry helper; the denominator of the SQL view's rebuild.
- **sql view** (with --database-url): the SQL view (projections/sqlview) run by the projection
  runner on the service's log, as serve runs it with --projection-db, in a schema of its own.
  Live: beside the closed loop over the bus (fsync interval), its apply rate and its lag,
  sampled every 20 ms as how long the oldest event it lacked had been in the log. Rebuild:
  what torpor replay --view sql runs (the whole log folded in memory into new tables with
  COPY, caught up, swapped in in one transaction), events/s over the whole log, next to the
  raw batched upsert measured right before it (a rebuild writes a history row per event
  and a view row per sandbox).
- **bus floor**: the raw async append again, with the bus work the pipeline does per event
  on top and none of its logic: a KV put for every second event (the view's writes), a
  delivery to one ordered consumer (the reading the sagas and the view share), a KV watch
  on another connection (the clients). No commands, supervisor reports, JSON or state machine: the most the substrate
  allows the pipeline on this machine.
- **pipeline**: --sandboxes sim sandboxes, --concurrency clients on the bus, each cycling its
  share through suspend → suspended → resume → ready; a transition counts, and is timed
  (the closed loop's p50 and p99), once the KV phase view shows it; events/s counts
  everything appended to TORPOR_EVENTS meanwhile (requests, outcomes, supervisor attaches).
- **closed loop over HTTP**: the same clients and sandboxes cycling the same way over the
  HTTP API, as users drive it: the command, then GET /v1/sandboxes/{id}/wait?phase=…&after=SEQ
  with the sequence the command answered, through the Go SDK (one keep-alive connection per
  client), where the pipeline's clients watch the KV view themselves. Printed next to the
  closed loop with their ratios: of transitions/s, and of p50 (above 1: slower); the targets
  (issue 15, raised by issue 28): at least 0.9 of the transitions/s, at most 1.15× the p50,
  in each fsync mode.
- **round trips**: what the two command paths cost bare, with the closed loop's clients and
  nothing else running: a command-sized POST answered with a view-sized body by net/http on
  loopback (one keep-alive connection per client, as the SDK and serve are set up), and the
  same bodies as a core NATS request to a responder on a connection of its own. No JSON, no
  handler work. Per transition a client over HTTP makes one round trip (the command with
  ?wait=true, answered with its outcome) where one over the bus makes one request and learns
  the outcome from a watch of the view. A transition over HTTP costs at least the bus's CPU
  per transition, less a bus request, plus an HTTP round trip, even if nothing else it does
  cost more: printed is the
  most transitions the HTTP loop can make per CPU second next to the bus's (the bus's CPU
  per transition over that least), and what it made (the bus's CPU per transition over its
  own). The round trips run after the timed runs of their mode, so the two are minutes apart
  and each carries this host's noise: the room is a bound on the order of the figures, not
  to the digit. Where the cores are what limits both loops, and they keep the same share of
  them busy, that is also the most of the bus's transitions/s the HTTP loop can reach; a
  loop that keeps more of the cores busy than the other (or one waiting on fsync) can reach
  more.
- **latency**: an open loop offering half the measured transitions/s (or --rate), suspends
  and resumes in turn as in the closed loop, each command on an idle sandbox, sent when it
  comes due (a late loop catches up rather than offering less), timed from sending the
  command to the view showing its outcome: a figure, not a target. **raw append p50/p99** is one append with the check at a time,
  offered at the same rate on the same server right after: the latency of a single hop. A suspend's path from command to view
  is about eight such hops (request, append, reply, saga delivery, outcome append,
  projection delivery, KV put, watch delivery); a resume's adds the consumption, the
  supervisor's report and its append. **latency by command** splits the same samples
  into suspends and resumes.
- **latency at 50% busy**: the same open loop at the rate that keeps the cores half busy,
  which the p99 target is judged on. A transition costs more CPU the fewer are in flight, so
  the rate is found by measuring: from the latency run's cost, short calibration runs (a
  third of --duration, at most 2 s) each correct the rate by their share of busy cores,
  aiming at 47.5%, at most three, until one lands at 45–50% busy; the rate never exceeds
  half the closed loop's (half the capacity left free, whatever bounds it: with --fsync
  always the log's syncs, not the cores, and then the line says the rate was capped). The judged run follows at that rate for --duration, with its own cost and the host
  probe's slow episodes of that run beside its p99.
- **cost**: this process's CPU time per transition (service, embedded server and the bench's
  clients together) and the share of the cores it kept busy, in the closed loop and in the
  open loop; and the messages the server took in and sent out per event appended, where a
  raw append is two (the publish and its ack). Fewer commands in flight batch less, so a
  transition costs more CPU in the open loop than in the closed one.
- **host**: a probe thread times a small chunk of arithmetic every 5 ms in its own CPU
  time, which the guest's scheduler cannot inflate; a chunk that takes five times its usual
  time means the machine under this one ran it slower (on a virtual machine: the host gave
  the processors to someone else, or was busy backing the guest's memory). Every latency
  in such a window stretches with it, so a latency run with slow episodes says as much
  about the host as about the service.
- **growth** (fsync interval): settled histories imported straight into the log, then the
  service restarted at each size; latency is sampled on 200 sandboxes (and 100 with the long
  history), the first command on each (cold cache: history loaded) apart from the rest.
  Heap per idle sandbox is the live heap difference between the largest and smallest size,
  embedded NATS server included.
- **replay**: the whole log read with an ordered consumer (no decoding), next to a rebuild of
  the KV view into a fresh bucket.
- **process** (fsync interval): each freezer this machine has freezes and thaws a process
  group (a shell running sleep in a loop, in a cgroup of its own) 3000 times, as the process
  driver's suspend and resume do: each returns once the kernel says every process is frozen,
  or none is. Then a few process sandboxes running the same loop are suspended and resumed
  one command at a time through the whole pipeline over HTTP (command, saga, freeze or thaw,
  the supervisor's attach under the new generation, KV view, the SDK's wait).
- **cluster** (left out with --skip-cluster, and with --transport http): three NATS servers in
  this process, clustered over loopback routes, in operator mode with the bus's accounts as the
  single node's embedded server is, and three torpor nodes (c1, c2, c3) joined to them as
  serve --nats-url (all three) --nats-creds --replicas 3 runs them: the log, every bucket and
  the object store with a replica on each server. It runs in the primary fsync mode right
  after the single node's run. **raw**: the appends with the check of the single node's raw
  (one at a time, and the async window of --concurrency) on a stream of three replicas,
  through one server: the reference of the cluster's pipeline, as the raw async append is the
  single node's (the ratio column: pipeline events/s over it). The closed loop: the same
  --sandboxes, --concurrency and --duration over the bus; sandbox k is created and driven
  through server k mod 3, its outcomes read from a watch of the view through that server, and
  the servers' queue group spreads the commands over the three nodes' gateways (how many each
  handled is printed). Printed as a row under the single node's, with cluster ÷ single of
  transitions/s, p50 and the raw async append (ratios cluster_vs_single_*), and server
  messages per event over every server, routes (replication) included. The six servers and
  nodes share this machine's cores and disk with the bench's clients: the ratio is what three
  copies of everything and three nodes cost on one machine, not what three machines serve.
- **runs** (--runs, 3 by default): this host stalls for tens of milliseconds several times per
  ten seconds, and a single run put figures on either side of a target. So each fsync mode
  runs --runs times, for --duration each, the modes alternating (interval, always, interval,
  …), and within each run the raw bus right before the pipeline it is divided by: a slow
  phase of the host falls on both sides of a ratio. The first table has a row per run, in
  the order they ran; the lines under it are each mode's median run (by closed-loop
  transitions/s), with that run's own ratios. The growth section's steady sample runs
  --runs times at each size (its target pairs the k-th run at the largest size with the k-th
  at the smallest); its restart to ready and the replay's read and rebuild also run --runs
  times, alternating; a freezer's cycles are split into --runs blocks of cycles, each with
  its p99, and the vm section's rounds and moves into --runs blocks, each with its p50. The
  heap, the snapshot bytes, the SQL view and the cluster run once ("1 run").
- **targets**, each judged on the median of its runs and printed with every run's figure
  (beyond five runs, the least and the greatest): per fsync mode, the closed loop over HTTP
  at least 0.9 of the bus's transitions/s and at most 1.15× its p50, and at most 4 server
  messages per event in the closed loop over the bus; the closed loop over the bus with fsync
  always at least half of the one with fsync interval (each always run over the interval
  run just before it); pipeline events/s at least half the bus floor with fsync interval,
  and at least half the raw async append with fsync always; p99 at most 10 ms at 50% of the
  cores busy (fsync interval); the growth, heap, restart and rebuild targets below the
  tables; freeze and thaw of a process group at most 10 ms p99 with each freezer.
- **what changed** (--compare FILE): each target next to the same target's line in an
  earlier report (this file before it was regenerated): its figure and verdict then and now,
  the target where it moved, and now ÷ then.
`
