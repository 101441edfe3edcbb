package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events/jsstore"
	torpor "github.com/torpor/torpor/sdk/go"
)

// benchConfig is what `torpor bench` takes from its flags.
type benchConfig struct {
	Sandboxes   int
	Concurrency int
	Fsync       string // empty: both modes
	Quick       bool
	Output      string
	Transport   string
	Duration    time.Duration
	// Rate is the latency run's offered transitions/s; 0 means half the
	// closed loop's measured rate, the rate the p99 target is set at.
	Rate        float64
	DatabaseURL string
	CPUProfile  string
	SkipGrowth  bool
	// growth sizes and history lengths
	sizes        []int
	shortHistory int
	longHistory  int
	longSample   int
	sample       int
}

func (c *benchConfig) defaults() error {
	if c.Quick {
		c.Sandboxes = min(c.Sandboxes, 200)
		c.Concurrency = min(c.Concurrency, 16)
		c.Duration = min(c.Duration, 3*time.Second)
		c.sizes, c.longHistory, c.longSample, c.sample = []int{1000, 10_000}, 200, 50, 100
	} else {
		c.sizes, c.longHistory, c.longSample, c.sample = []int{1000, 10_000, 100_000}, 1000, 100, 200
	}
	c.shortHistory = 10
	switch {
	case c.Sandboxes < 1 || c.Concurrency < 1:
		return errors.New("--sandboxes and --concurrency: want 1 or more")
	case c.Concurrency > c.Sandboxes:
		return fmt.Errorf("--concurrency %d above --sandboxes %d: each client needs a sandbox of its own", c.Concurrency, c.Sandboxes)
	case c.Fsync != "" && c.Fsync != "always" && c.Fsync != "interval":
		return fmt.Errorf("--fsync %q: want always or interval (or nothing for both)", c.Fsync)
	case c.Transport != "bus" && c.Transport != "http":
		return fmt.Errorf("--transport %q: want bus or http", c.Transport)
	case c.Output != "table" && c.Output != "json" && c.Output != "markdown":
		return fmt.Errorf("-o %q: want table, json or markdown", c.Output)
	case c.Duration <= 0:
		return errors.New("--duration: want a positive duration")
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("--rate %v: want transitions per second above 0, or 0 for half the measured maximum", c.Rate)
	}
	return nil
}

func benchCmd() *cobra.Command {
	cfg := benchConfig{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "measure the pipeline against the raw bus, in one run, on an embedded server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Output, _ = cmd.Flags().GetString("output")
			// From the environment, so that `task benchmarks` measures SQL
			// where a database is at hand and the command BENCHMARKS.md
			// records carries no password.
			if !cmd.Flags().Changed("database-url") {
				cfg.DatabaseURL = os.Getenv("TORPOR_BENCH_DATABASE_URL")
			}
			if err := cfg.defaults(); err != nil {
				return err
			}
			rep, err := runBench(cmd.Context(), cfg, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if cfg.Output == "markdown" {
				rep.markdown(cmd.OutOrStdout(), "go run ./cmd/torpor "+strings.Join(os.Args[1:], " "))
				return nil
			}
			if cfg.Output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			rep.print(cmd.OutOrStdout())
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Sandboxes, "sandboxes", 1000, "sandboxes in the pipeline run")
	f.IntVar(&cfg.Concurrency, "concurrency", 64, "concurrent clients (and the raw async window)")
	f.StringVar(&cfg.Fsync, "fsync", "", "always or interval; both when empty")
	f.BoolVar(&cfg.Quick, "quick", false, "smaller sizes, under 45 seconds")
	f.StringVar(&cfg.Transport, "transport", "bus", "command path: bus or http")
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of each timed run")
	f.Float64Var(&cfg.Rate, "rate", 0, "transitions/s the latency run offers (default: half the closed loop's measured rate; the p99 target is judged only then)")
	f.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of the closed-loop pipeline run (service and load) to this file; FILE.always for the fsync always run when both run")
	f.BoolVar(&cfg.SkipGrowth, "skip-growth", false, "only the raw bus, pipeline and latency sections")
	f.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL/CockroachDB URL (default $TORPOR_BENCH_DATABASE_URL): adds the raw batched SQL upsert (view rows and a checkpoint per transaction, in throwaway torpor_bench_ tables); the SQL rebuild row waits for the SQL view")
	return cmd
}

// modeResult is one durability mode's run.
type modeResult struct {
	Fsync    string             `json:"fsync"`
	Raw      rawResult          `json:"raw"`
	Pipeline pipelineResult     `json:"pipeline"`
	Latency  latencyResult      `json:"latency_ms"`
	Ratios   map[string]float64 `json:"ratios"`
}

type growthRow struct {
	Sandboxes        int           `json:"sandboxes"`
	EventsPerSandbox int           `json:"events_per_sandbox"`
	LogEvents        int           `json:"log_events"`
	FirstTouch       latencyResult `json:"first_touch_ms"`
	Steady           latencyResult `json:"steady_ms"`
}

type growthResult struct {
	Rows                []growthRow `json:"rows"`
	CatchUpEPS          float64     `json:"catch_up_eps"`
	HeapPerSandboxBytes float64     `json:"heap_per_sandbox_bytes"`
	RecoverySeconds     float64     `json:"recovery_seconds"`
	RecoverySandboxes   int         `json:"recovery_sandboxes"`
}

type replayResult struct {
	Events            int     `json:"events"`
	RawOrderedReadEPS float64 `json:"raw_ordered_read_eps"`
	KVRebuildEPS      float64 `json:"kv_rebuild_eps"`
}

type target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Cmp   string  `json:"cmp"`
	Want  float64 `json:"want"`
	Met   bool    `json:"met"`
}

// benchReport is the JSON document of `torpor bench -o json`. The top-level
// raw, pipeline, latency_ms and ratios are the primary mode's (interval when
// it ran).
type benchReport struct {
	Machine  map[string]any     `json:"machine"`
	Config   map[string]any     `json:"config"`
	Modes    []modeResult       `json:"modes"`
	Raw      rawResult          `json:"raw"`
	Pipeline pipelineResult     `json:"pipeline"`
	Latency  latencyResult      `json:"latency_ms"`
	Growth   *growthResult      `json:"growth,omitempty"`
	Replay   *replayResult      `json:"replay,omitempty"`
	Ratios   map[string]float64 `json:"ratios"`
	Targets  []target           `json:"targets"`
	Notes    []string           `json:"notes"`
	Seconds  float64            `json:"seconds"`
}

// runBench runs every section and assembles the report; progress goes to log.
func runBench(ctx context.Context, cfg benchConfig, log io.Writer) (*benchReport, error) {
	began := time.Now()
	host, _ := os.Hostname()
	rep := &benchReport{
		Machine: map[string]any{"host": host, "cpus": runtime.NumCPU(), "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH},
		Config: map[string]any{"sandboxes": cfg.Sandboxes, "concurrency": cfg.Concurrency, "fsync": cfg.Fsync, "quick": cfg.Quick,
			"transport": cfg.Transport, "duration": cfg.Duration.String(), "growth_sizes": cfg.sizes},
		Ratios: map[string]float64{},
	}
	// The SQL upsert does not depend on the bus: it runs once, first, so a
	// bad URL fails the bench before the long part, and its figure goes in
	// every mode's raw result.
	var sqlEPS *float64
	if cfg.DatabaseURL != "" {
		fmt.Fprintf(log, "bench: batched SQL upsert over %d keys for %s\n", cfg.Sandboxes, cfg.Duration)
		s, err := benchSQLUpsert(ctx, cfg.DatabaseURL, cfg.Sandboxes, sqlBenchRowsPerTx, cfg.Duration)
		if err != nil {
			return nil, err
		}
		sqlEPS = &s.RowsPerS
		rep.Config["sql_rows_per_tx"] = s.RowsPerTx
		rep.Notes = append(rep.Notes, "the SQL rebuild row waits for the SQL view: of SQL, only the raw batched upsert was measured")
	}
	modes := []string{"interval", "always"}
	if cfg.Fsync != "" {
		modes = []string{cfg.Fsync}
	}
	for _, m := range modes {
		fmt.Fprintf(log, "bench: fsync %s: raw bus, then %d sandboxes × %d clients over %s\n", m, cfg.Sandboxes, cfg.Concurrency, cfg.Transport)
		mr, err := runMode(ctx, cfg, m)
		if err != nil {
			return nil, fmt.Errorf("fsync %s: %w", m, err)
		}
		mr.Raw.SQLUpsertEPS = sqlEPS
		rep.Modes = append(rep.Modes, mr)
	}
	primary := rep.Modes[0]
	rep.Raw, rep.Pipeline, rep.Latency = primary.Raw, primary.Pipeline, primary.Latency
	for k, v := range primary.Ratios {
		rep.Ratios[k] = v
	}
	if !cfg.SkipGrowth && (cfg.Fsync == "" || cfg.Fsync == "interval") {
		fmt.Fprintf(log, "bench: growth over %v sandboxes, replay, recovery (fsync interval)\n", cfg.sizes)
		g, r, err := runGrowth(ctx, cfg, log)
		if err != nil {
			return nil, fmt.Errorf("growth: %w", err)
		}
		rep.Growth, rep.Replay = g, r
		if len(g.Rows) >= 2 && g.Rows[0].Steady.P50 > 0 {
			rep.Ratios["growth_latency_p50"] = g.Rows[len(g.Rows)-1].Steady.P50 / g.Rows[0].Steady.P50
			rep.Ratios["growth_latency_p99"] = g.Rows[len(g.Rows)-1].Steady.P99 / g.Rows[0].Steady.P99
		}
		if r.RawOrderedReadEPS > 0 {
			rep.Ratios["kv_rebuild_vs_raw_read"] = r.KVRebuildEPS / r.RawOrderedReadEPS
		}
	}
	rep.targets(cfg.Rate == 0)
	if cfg.Rate > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the latency run offered --rate %g transitions/s, not half the measured maximum: the p99 target was not judged", cfg.Rate))
	}
	rep.Seconds = time.Since(began).Seconds()
	return rep, nil
}

// profile starts the CPU profile of the pipeline run in mode fsync, if one
// was asked for, and returns the function that stops it.
func profile(cfg benchConfig, fsync string) (stop func(), err error) {
	if cfg.CPUProfile == "" {
		return func() {}, nil
	}
	path := cfg.CPUProfile
	if cfg.Fsync == "" && fsync == "always" {
		path += ".always"
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// runMode measures the raw bus and the pipeline on a fresh service in one
// durability mode.
// benchServeConfig is how the bench runs the service: serve's defaults over
// dir, on random ports.
func benchServeConfig(dir, fsync string) serveConfig {
	return serveConfig{Data: dir, HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Fsync: fsync, Node: "local",
		Deadline: time.Minute, DuplicateWindow: jsstore.DefaultDuplicateWindow}
}

func runMode(ctx context.Context, cfg benchConfig, fsync string) (modeResult, error) {
	mr := modeResult{Fsync: fsync, Ratios: map[string]float64{}}
	dir, err := os.MkdirTemp("", "torpor-bench-")
	if err != nil {
		return mr, err
	}
	defer os.RemoveAll(dir)
	a, err := start(ctx, benchServeConfig(dir, fsync), zerolog.Nop())
	if err != nil {
		return mr, err
	}
	defer func() { _ = a.Stop() }()
	nc, err := nats.Connect(a.NATSURL)
	if err != nil {
		return mr, err
	}
	defer nc.Close()

	rawDur := min(cfg.Duration/3, 3*time.Second)
	if mr.Raw, err = benchRaw(ctx, nc, cfg.Sandboxes, cfg.Concurrency, rawDur); err != nil {
		return mr, err
	}
	js, _ := jetstream.New(nc)
	vw, err := newViewWaiter(ctx, js)
	if err != nil {
		return mr, err
	}
	cmd := commanderFor(cfg.Transport, a, nc)
	ids, createRate, err := createReady(ctx, cmd, vw, cfg.Sandboxes, cfg.Concurrency)
	if err != nil {
		return mr, err
	}
	before, viewsBefore, err := logAndViewSeqs(ctx, js)
	if err != nil {
		return mr, err
	}
	stopProfile, err := profile(cfg, fsync)
	if err != nil {
		return mr, err
	}
	c0, err := readCost(a.ns)
	if err != nil {
		return mr, err
	}
	stopProbe := probeHost()
	transitions, secs, err := cycle(ctx, cmd, vw, ids, cfg.Concurrency, cfg.Duration)
	host := stopProbe()
	stopProfile()
	if err != nil {
		return mr, err
	}
	c1, err := readCost(a.ns)
	if err != nil {
		return mr, err
	}
	after, viewsAfter, err := logAndViewSeqs(ctx, js)
	if err != nil {
		return mr, err
	}
	mr.Pipeline = pipelineResult{
		Transport: cfg.Transport, Sandboxes: cfg.Sandboxes, Concurrency: cfg.Concurrency, Seconds: secs,
		Transitions: transitions, Events: after - before, TransitionsPerS: float64(transitions) / secs,
		EventsPerS: float64(after-before) / secs, CreateToReadyPerS: createRate, ViewWrites: viewsAfter - viewsBefore,
	}
	mr.Pipeline.CPUMsPerTransition, mr.Pipeline.CoresBusy, mr.Pipeline.ServerMsgsPerEvent = c1.spent(c0, int(transitions), after-before)
	mr.Pipeline.Host = host
	stopProbe = probeHost()
	rate := mr.Pipeline.TransitionsPerS / 2
	if cfg.Rate > 0 {
		rate = cfg.Rate
	}
	mr.Latency, err = openLoop(ctx, cmd, vw, ids, rate, cfg.Duration)
	mr.Latency.Host = stopProbe()
	if err != nil {
		return mr, err
	}
	c2, err := readCost(a.ns)
	if err != nil {
		return mr, err
	}
	mr.Latency.CPUMsPerTransition, mr.Latency.CoresBusy, _ = c2.spent(c1, mr.Latency.Samples, 0)
	raw, err := rawAppendLatency(ctx, nc, cfg.Sandboxes, mr.Latency.OfferedPerS, min(cfg.Duration/3, 3*time.Second))
	if err != nil {
		return mr, err
	}
	mr.Raw.AppendLatency = &raw
	if mr.Raw.AppendCheckAsyncEPS > 0 {
		mr.Ratios["pipeline_vs_raw_append"] = mr.Pipeline.EventsPerS / mr.Raw.AppendCheckAsyncEPS
	}
	if mr.Raw.AppendCheckSyncEPS > 0 {
		mr.Ratios["pipeline_vs_raw_append_sync"] = mr.Pipeline.EventsPerS / mr.Raw.AppendCheckSyncEPS
	}
	if mr.Raw.BusFloorEPS > 0 && mr.Raw.AppendCheckAsyncEPS > 0 {
		mr.Ratios["bus_floor_vs_raw_append"] = mr.Raw.BusFloorEPS / mr.Raw.AppendCheckAsyncEPS
		mr.Ratios["pipeline_vs_bus_floor"] = mr.Pipeline.EventsPerS / mr.Raw.BusFloorEPS
	}
	return mr, nil
}

func commanderFor(transport string, a *app, nc *nats.Conn) commander {
	if transport == "http" {
		return httpCommander{c: torpor.New(a.HTTPAddr, nil)}
	}
	return busCommander{nc: nc}
}

// lastSeq is the last sequence of stream.
// logAndViewSeqs returns the last sequences of the log and of the KV view's
// stream: their differences over a run count the events appended and the
// view writes.
func logAndViewSeqs(ctx context.Context, js jetstream.JetStream) (logSeq, viewSeq uint64, err error) {
	if logSeq, err = lastSeq(ctx, js, "TORPOR_EVENTS"); err != nil {
		return 0, 0, err
	}
	viewSeq, err = lastSeq(ctx, js, "KV_torpor_phases")
	return logSeq, viewSeq, err
}

func lastSeq(ctx context.Context, js jetstream.JetStream, stream string) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// targets checks the targets against what this run measured; the
// p99 one only when halfMax, the latency run having offered half the closed
// loop's rate.
func (r *benchReport) targets(halfMax bool) {
	add := func(name string, v float64, cmp string, want float64, ok bool) {
		if !ok {
			return
		}
		met := v >= want
		if cmp == "<=" {
			met = v <= want
		}
		r.Targets = append(r.Targets, target{Name: name, Value: v, Cmp: cmp, Want: want, Met: met})
	}
	for _, m := range r.Modes {
		v, ok := m.Ratios["pipeline_vs_raw_append"]
		add("pipeline events/s ÷ raw async append ("+m.Fsync+")", v, ">=", 0.5, ok)
		if m.Fsync == "interval" {
			add("p99 ms at half the max rate (interval)", m.Latency.P99, "<=", 10, halfMax && m.Latency.Samples > 0)
		}
	}
	if g := r.Growth; g != nil {
		v, ok := r.Ratios["growth_latency_p50"]
		add("command latency, largest fleet & longest history ÷ smallest (p50)", v, "<=", 1.25, ok)
		add("heap bytes per idle sandbox", g.HeapPerSandboxBytes, "<=", 2048, g.HeapPerSandboxBytes > 0)
		add(fmt.Sprintf("restart to ready with %d sandboxes (s)", g.RecoverySandboxes), g.RecoverySeconds, "<=", 3, g.RecoverySeconds > 0)
	}
	v, ok := r.Ratios["kv_rebuild_vs_raw_read"]
	add("KV rebuild ÷ raw ordered read", v, ">=", 0.5, ok)
}

// print writes the report as tables, with the gap of every target missed.
func (r *benchReport) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "torpor bench — %v CPUs, %s, %s; transport %s, %d sandboxes, %d clients\n\n", r.Machine["cpus"], r.Machine["go"], r.Machine["os"], r.Pipeline.Transport, r.Pipeline.Sandboxes, r.Pipeline.Concurrency)
	fmt.Fprintln(tw, "fsync\traw sync append/s\traw async append/s\traw ordered read/s\traw KV put/s\tpipeline events/s\ttransitions/s\tratio\tp50 ms\tp90 ms\tp99 ms\tmax ms\traw append p50 ms\traw append p99 ms\t")
	for _, m := range r.Modes {
		var rl latencyResult
		if m.Raw.AppendLatency != nil {
			rl = *m.Raw.AppendLatency
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", m.Fsync, m.Raw.AppendCheckSyncEPS, m.Raw.AppendCheckAsyncEPS,
			m.Raw.OrderedReadEPS, m.Raw.KVPutEPS, m.Pipeline.EventsPerS, m.Pipeline.TransitionsPerS, m.Ratios["pipeline_vs_raw_append"],
			m.Latency.P50, m.Latency.P90, m.Latency.P99, m.Latency.Max, rl.P50, rl.P99)
	}
	tw.Flush()
	for _, m := range r.Modes {
		if m.Raw.BusFloorEPS > 0 {
			fmt.Fprintf(w, "bus floor (%s): %.0f events/s = %.2f of raw async; the pipeline runs at %.2f of it\n", m.Fsync, m.Raw.BusFloorEPS,
				m.Ratios["bus_floor_vs_raw_append"], m.Ratios["pipeline_vs_bus_floor"])
		}
	}
	for _, m := range r.Modes {
		fmt.Fprintf(w, "cost (%s): closed loop %.2f ms CPU per transition, %.0f%% of the cores busy, %.1f server messages per event (a raw append: 2); open loop at half its rate %.2f ms per transition, %.0f%% busy\n",
			m.Fsync, m.Pipeline.CPUMsPerTransition, 100*m.Pipeline.CoresBusy, m.Pipeline.ServerMsgsPerEvent, m.Latency.CPUMsPerTransition, 100*m.Latency.CoresBusy)
	}
	for _, m := range r.Modes {
		if h := m.Latency.Host; h != nil {
			fmt.Fprintf(w, "host (%s): during the latency run the machine ran slow (a %.0fµs chunk of arithmetic taking %d× its CPU time or more) for about %.0f ms in %d episodes, at worst %.0f× (closed loop: %s)\n",
				m.Fsync, h.ChunkUS, probeSlow, h.SlowMS, h.Episodes, h.WorstX, m.Pipeline.Host.brief())
		}
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
		fmt.Fprintf(w, "replay of %d events: raw ordered read %.0f/s, KV rebuild %.0f/s\n", rp.Events, rp.RawOrderedReadEPS, rp.KVRebuildEPS)
	}
	fmt.Fprintln(w)
	for _, t := range r.Targets {
		mark := "met"
		if !t.Met {
			gap := t.Value / t.Want
			if t.Cmp == "<=" {
				gap = t.Want / t.Value
			}
			mark = fmt.Sprintf("MISSED (at %.0f%% of the target)", 100*gap)
		}
		fmt.Fprintf(w, "target %-66s %10.3f %s %-8g %s\n", t.Name, t.Value, t.Cmp, t.Want, mark)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", strings.TrimSpace(n))
	}
	fmt.Fprintf(w, "\nran %.0fs\n", r.Seconds)
}

// markdown writes BENCHMARKS.md: the machine, the exact command, the tables.
func (r *benchReport) markdown(w io.Writer, command string) {
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
	r.print(w)
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
  cockroach-go's retry helper; the denominator of the SQL view's rebuild, which is not built yet.
- **bus floor**: the raw async append again, with the bus work the pipeline does per event
  on top and none of its logic: a KV put for every second event (the view's writes), a
  delivery to one ordered consumer (the reading the sagas and the view share), a KV watch
  on another connection (the clients). No commands, supervisor reports, JSON or state machine: the most the substrate
  allows the pipeline on this machine.
- **pipeline**: --sandboxes sim sandboxes, --concurrency clients on the bus, each cycling its
  share through suspend → suspended → resume → ready; a transition counts once the KV phase
  view shows it; events/s counts everything appended to TORPOR_EVENTS meanwhile (requests,
  outcomes, supervisor attaches).
- **latency**: an open loop offering half the measured transitions/s, suspends and resumes in
  turn as in the closed loop, each command on an idle sandbox, sent when it comes due (a late
  loop catches up rather than offering less), timed from sending the command to the view
  showing its outcome. **raw append p50/p99** is one append with the check at a time,
  offered at the same rate on the same server right after: the latency of a single hop. A suspend's path from command to view
  is about eight such hops (request, append, reply, saga delivery, outcome append,
  projection delivery, KV put, watch delivery); a resume's adds the consumption, the
  supervisor's report and its append. **latency by command** splits the same samples
  into suspends and resumes.
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
`
