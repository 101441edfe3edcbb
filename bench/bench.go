// Package bench is the benchmark harness behind `torpor bench`: it runs the
// real service on an embedded server and measures, in one run, the raw bus
// (appends, reads, KV puts, the bus floor) next to the full pipeline, its
// latency, its cost, how it grows with the fleet and its history, and the
// replay, and judges the targets. Only cmd/torpor imports it; it starts the
// service through a Starter that cmd/torpor hands it.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Service is a running torpor service as `torpor serve` wires it.
type Service interface {
	HTTPAddr() string
	// AdminToken is the bearer token the bench's HTTP clients send.
	AdminToken() string
	NATSURL() string
	// NATSOptions connect to NATSURL as the service (its bus user).
	NATSOptions() []nats.Option
	// Server is the embedded nats-server, whose counters the cost line reads.
	Server() *server.Server
	// Ready is what /readyz answers.
	Ready(ctx context.Context) error
	// ViewLag is how many events of the log the phase view has yet to apply.
	ViewLag(ctx context.Context) (uint64, error)
	Stop() error
}

// Starter starts the service over the data directory dir with fsync
// "always" or "interval", on random ports, for node "local". Nodes are other
// nodes the service drives (serve --remote-nodes), each served by a `torpor
// driver` of its own with the vm driver, over a data directory of its own
// under dir, on the service's NATS; Stop stops them too.
type Starter func(ctx context.Context, dir, fsync string, nodes ...string) (Service, error)

// Config is what a run measures, and how much of it.
type Config struct {
	Sandboxes   int
	Concurrency int
	Fsync       string // empty: both modes
	Quick       bool
	Transport   string // bus or http
	Duration    time.Duration
	// Runs is how many runs of each fsync mode judge its targets, the
	// modes alternating (interval, always, interval, …), each target on
	// the median of its runs; also how many restarts and replays, and the
	// blocks the freezers' cycles are split in. 0 is one run.
	Runs int
	// Rate is the offered transitions/s of the latency figure run; 0 means
	// half the closed loop's measured rate. The p99 target's run finds its
	// own rate, whatever Rate is.
	Rate        float64
	DatabaseURL string
	CPUProfile  string
	// HeapProfile, if set, is where the growth section writes the live
	// heap's profile (inuse_space) at the smallest and the largest fleet
	// size, as FILE.<size>, right where it reads the heap per sandbox: the
	// two are what `go tool pprof -base` diffs.
	HeapProfile string
	SkipGrowth  bool
	// SkipProcess leaves out the process driver's section, SkipVM the vm
	// driver's.
	SkipProcess bool
	SkipVM      bool
	// SkipWake leaves out the wake-on-traffic rows (RunWake, which runs
	// with the process section; RunVMWake, with the vm section).
	SkipWake bool
	// SkipCluster leaves out the cluster section (RunCluster), whose
	// nodes StartNode starts.
	SkipCluster bool
	StartNode   NodeStarter
	// The growth section: the fleet sizes, the events of each sandbox's
	// history, how many sandboxes of LongHistory events join at the
	// largest size, and how many sandboxes are sampled at each. Zero means
	// the default (smaller with Quick).
	Sizes        []int
	ShortHistory int
	LongHistory  int
	LongSample   int
	Sample       int
}

// withDefaults fills c's zero growth settings, and with Quick caps the
// sizes of the run (and each run's duration, so that all runs together
// time each figure for as long as one quick run did).
func (c Config) withDefaults() Config {
	sizes, long, longSample, sample := []int{1000, 10_000, 100_000}, 1000, 100, 200
	if c.Quick {
		c.Sandboxes = min(c.Sandboxes, 200)
		c.Concurrency = min(c.Concurrency, 16)
		c.Duration = min(c.Duration, 3*time.Second/time.Duration(max(1, c.Runs))) // 3 s of each figure in all
		sizes, long, longSample, sample = []int{1000, 10_000}, 200, 50, 100
	}
	if len(c.Sizes) == 0 {
		c.Sizes = sizes
	}
	if c.ShortHistory == 0 {
		c.ShortHistory = 10
	}
	if c.LongHistory == 0 {
		c.LongHistory = long
	}
	if c.LongSample == 0 {
		c.LongSample = longSample
	}
	if c.Sample == 0 {
		c.Sample = sample
	}
	return c
}

// Validate reports the first setting of c the bench cannot run with, by
// the flag of `torpor bench` that sets it.
func (c Config) Validate() error {
	_, err := c.resolved()
	return err
}

// resolved is c with its defaults filled (withDefaults), or the error of
// Validate.
func (c Config) resolved() (Config, error) {
	c = c.withDefaults()
	switch {
	case c.Sandboxes < 1 || c.Concurrency < 1:
		return Config{}, errors.New("--sandboxes and --concurrency: want 1 or more")
	case c.Concurrency > c.Sandboxes:
		return Config{}, fmt.Errorf("--concurrency %d above --sandboxes %d: each client needs a sandbox of its own", c.Concurrency, c.Sandboxes)
	case c.Fsync != "" && c.Fsync != "always" && c.Fsync != "interval":
		return Config{}, fmt.Errorf("--fsync %q: want always or interval (or nothing for both)", c.Fsync)
	case c.Transport != "bus" && c.Transport != "http":
		return Config{}, fmt.Errorf("--transport %q: want bus or http", c.Transport)
	case c.Runs < 0:
		return Config{}, fmt.Errorf("--runs %d: want 1 or more", c.Runs)
	case c.Duration <= 0:
		return Config{}, errors.New("--duration: want a positive duration")
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return Config{}, fmt.Errorf("--rate %v: want transitions per second above 0, or 0 for half the measured maximum", c.Rate)
	case slices.ContainsFunc(c.Sizes, func(n int) bool { return n < 1 }) || !slices.IsSorted(c.Sizes):
		return Config{}, fmt.Errorf("growth sizes %v: want sizes of 1 or more, growing", c.Sizes)
	case c.ShortHistory < 0 || c.LongHistory < 0 || c.LongSample < 0 || c.Sample < 0:
		return Config{}, errors.New("growth histories and samples: want 0 (the default) or more")
	}
	return c, nil
}

// Run runs every section of cfg on services start starts, and assembles the
// report; what it is doing goes to progress.
func Run(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*Report, error) {
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, err
	}
	// The cluster's closed loop runs over the bus; with --transport http
	// the single node's runs over HTTP, and the two would not compare.
	cluster := !cfg.SkipCluster && cfg.Transport == "bus"
	if cluster && cfg.StartNode == nil {
		return nil, errors.New("the cluster section wants a node starter (or --skip-cluster)")
	}
	began := time.Now()
	host, _ := os.Hostname()
	rep := &Report{
		Machine: map[string]any{"host": host, "cpus": runtime.NumCPU(), "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH},
		Config: map[string]any{"sandboxes": cfg.Sandboxes, "concurrency": cfg.Concurrency, "fsync": cfg.Fsync, "quick": cfg.Quick,
			"transport": cfg.Transport, "duration": cfg.Duration.String(), "growth_sizes": cfg.Sizes, "rate": cfg.Rate, "runs": max(1, cfg.Runs)},
		Ratios: map[string]float64{},
	}
	// The SQL upsert does not depend on the bus: it runs once, first, so a
	// bad URL fails the bench before the long part, and its figure goes in
	// every mode's raw result.
	var sqlEPS *float64
	if cfg.DatabaseURL != "" {
		fmt.Fprintf(progress, "bench: batched SQL upsert over %d keys for %s\n", cfg.Sandboxes, cfg.Duration)
		s, err := measureSQLUpsert(ctx, cfg.DatabaseURL, cfg.Sandboxes, sqlBenchRowsPerTx, cfg.Duration)
		if err != nil {
			return nil, err
		}
		sqlEPS = &s.RowsPerS
		rep.Config["sql_rows_per_tx"] = s.RowsPerTx
	}
	modes := []string{"interval", "always"}
	if cfg.Fsync != "" {
		modes = []string{cfg.Fsync}
	}
	// The modes' runs alternate, so that a slow phase of the host falls on
	// both modes' runs rather than on one mode's, and within a run the
	// raw bus precedes the pipeline it is divided by.
	runs := max(1, cfg.Runs)
	for k := range runs {
		for _, m := range modes {
			fmt.Fprintf(progress, "bench: fsync %s (run %d of %d): raw bus, then %d sandboxes × %d clients over %s\n", m, k+1, runs, cfg.Sandboxes, cfg.Concurrency, cfg.Transport)
			c := cfg
			if k > 0 {
				c.CPUProfile = "" // the first run's profile only
			}
			mr, err := RunMode(ctx, c, m, start)
			if err != nil {
				return nil, fmt.Errorf("fsync %s: %w", m, err)
			}
			mr.Raw.SQLUpsertEPS = sqlEPS
			mr.Run, mr.Of = k+1, runs
			rep.Runs = append(rep.Runs, mr)
			if len(rep.Runs) == 1 && cluster {
				// Right after the single node's closed loop in the same mode,
				// so that the two are minutes apart at most.
				if rep.Cluster, err = RunCluster(ctx, cfg, m, cfg.StartNode, progress); err != nil {
					return nil, fmt.Errorf("cluster: %w", err)
				}
			}
		}
	}
	by := rep.runsByMode()
	for _, m := range modes {
		rep.Modes = append(rep.Modes, medianMode(by[m]))
	}
	primary := rep.Modes[0]
	rep.Raw, rep.Pipeline, rep.Latency, rep.Busy, rep.HTTP = primary.Raw, primary.Pipeline, primary.Latency, primary.Busy, primary.HTTP
	ratios := primary.Ratios
	if primary.RatioMedians != nil {
		ratios = primary.RatioMedians // what the targets are judged on
	}
	for k, v := range ratios {
		rep.Ratios[k] = v
	}
	if c := rep.Cluster; c != nil {
		rep.clusterRatios(primary, c)
	}
	if !cfg.SkipGrowth && (cfg.Fsync == "" || cfg.Fsync == "interval") {
		fmt.Fprintf(progress, "bench: growth over %v sandboxes, replay, recovery (fsync interval)\n", cfg.Sizes)
		g, r, err := RunGrowth(ctx, cfg, start, progress)
		if err != nil {
			return nil, fmt.Errorf("growth: %w", err)
		}
		rep.Growth, rep.Replay = g, r
		if len(g.Rows) >= 2 && g.Rows[0].Steady.P50 > 0 {
			rep.Ratios["growth_latency_p50"] = median(g.latencyRuns())
			rep.Ratios["growth_latency_p99"] = g.Rows[len(g.Rows)-1].Steady.P99 / g.Rows[0].Steady.P99
		}
		if vs := r.ratioRuns(); len(vs) > 0 {
			rep.Ratios["kv_rebuild_vs_raw_read"] = median(vs)
		}
	}
	if cfg.DatabaseURL != "" {
		v, err := RunSQLView(ctx, cfg, start, progress)
		if err != nil {
			return nil, fmt.Errorf("sql view: %w", err)
		}
		rep.SQLView = v
		if v.RawUpsertRowsPerS > 0 {
			rep.Ratios["sql_rebuild_vs_raw_upsert"] = v.RebuildEPS / v.RawUpsertRowsPerS
		}
	}
	if !cfg.SkipProcess {
		p, err := RunProcess(ctx, cfg, start, progress)
		if err != nil {
			return nil, fmt.Errorf("process: %w", err)
		}
		rep.Process = p
	}
	if !cfg.SkipProcess && !cfg.SkipWake {
		w, err := RunWake(ctx, cfg, start, progress)
		if err != nil {
			return nil, fmt.Errorf("wake: %w", err)
		}
		rep.Wake = w
	}
	if !cfg.SkipVM {
		v, err := RunVM(ctx, cfg, start, progress)
		if err != nil {
			return nil, fmt.Errorf("vm: %w", err)
		}
		rep.VM = v
	}
	if !cfg.SkipVM && !cfg.SkipWake {
		w, err := RunVMWake(ctx, cfg, start, progress)
		if err != nil {
			return nil, fmt.Errorf("wake vm: %w", err)
		}
		rep.WakeVM = w
	}
	if v := rep.alwaysVsInterval(); len(v) > 0 {
		rep.Ratios["closed_loop_always_vs_interval"] = median(v)
	}
	rep.targets()
	switch {
	case rep.Cluster != nil:
		rep.Notes = append(rep.Notes, fmt.Sprintf("cluster: %d NATS servers and %d torpor nodes run in this one process, sharing its %d cores and its disk with the bench's clients, all in operator mode with accounts as the single node's embedded server; the ratio is what three copies of every stream and three nodes cost on one machine, not what a cluster of three machines serves",
			rep.Cluster.Servers, rep.Cluster.Nodes, runtime.NumCPU()))
	case !cfg.SkipCluster:
		rep.Notes = append(rep.Notes, "cluster: not run with --transport http (its closed loop runs over the bus, the single node's then over HTTP)")
	}
	if cfg.Rate > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the latency figure run offered --rate %g transitions/s, not half the measured maximum; the p99 target's run found its own rate", cfg.Rate))
	}
	for _, m := range rep.Runs {
		switch b := m.Busy; {
		case b == nil:
			rep.Notes = append(rep.Notes, fmt.Sprintf("fsync %s: no CPU time read on this OS, so no rate at 50%% busy was found and the p99 target was not judged", m.label()))
		case b.CoresBusy > busyTarget*(1+busyTolerance):
			rep.Notes = append(rep.Notes, fmt.Sprintf("fsync %s: the p99 target's run kept the cores %.0f%% busy, more than the 50%% it is set at, after %d calibration runs", m.label(), 100*b.CoresBusy, len(b.Calibration)))
		case b.CoresBusy < busyTarget*(1-busyTolerance) && b.OfferedPerS >= m.Pipeline.TransitionsPerS:
			rep.Notes = append(rep.Notes, fmt.Sprintf("fsync %s: this process never kept the cores 50%% busy, not even at the closed loop's rate (%.0f%% there), so the p99 target was judged at that rate: the service waits on something else (fsync), or other processes hold the cores", m.label(), 100*m.Pipeline.CoresBusy))
		}
	}
	rep.Seconds = time.Since(began).Seconds()
	return rep, nil
}

// medianMode is the median run of one mode's runs by the closed loop's
// transitions/s, with the medians of each ratio over the runs (those the
// targets are judged on) beside its own.
func medianMode(runs []Mode) Mode {
	m := medianRun(runs, func(m Mode) float64 { return m.Pipeline.TransitionsPerS })
	if len(runs) == 1 {
		return m
	}
	all := map[string][]float64{}
	for _, run := range runs {
		for k, v := range run.Ratios {
			all[k] = append(all[k], v)
		}
	}
	m.RatioMedians = map[string]float64{}
	for k, vs := range all {
		m.RatioMedians[k] = median(vs)
	}
	return m
}

// profile starts the CPU profile of the pipeline run in mode fsync (with
// ".http": of the closed loop over HTTP after it), if one was asked for,
// and returns the function that stops it.
func profile(cfg Config, fsync string) (stop func(), err error) {
	if cfg.CPUProfile == "" {
		return func() {}, nil
	}
	path := cfg.CPUProfile
	mode, run, _ := strings.Cut(fsync, ".")
	if cfg.Fsync == "" && mode == "always" {
		path += ".always"
	}
	if run != "" {
		path += "." + run // FILE.http: the closed loop over HTTP
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

// RunMode measures the raw bus and the pipeline on a fresh service in one
// durability mode, fsync "always" or "interval".
func RunMode(ctx context.Context, cfg Config, fsync string, start Starter) (Mode, error) {
	mr := Mode{Fsync: fsync, Ratios: map[string]float64{}}
	cfg, err := cfg.resolved()
	if err != nil {
		return mr, err
	}
	dir, err := os.MkdirTemp("", "torpor-bench-")
	if err != nil {
		return mr, err
	}
	defer os.RemoveAll(dir)
	svc, err := start(ctx, dir, fsync)
	if err != nil {
		return mr, err
	}
	defer func() { _ = svc.Stop() }()
	nc, err := nats.Connect(svc.NATSURL(), svc.NATSOptions()...)
	if err != nil {
		return mr, err
	}
	defer nc.Close()

	rawDur := min(cfg.Duration/3, 3*time.Second)
	if mr.Raw, err = measureRaw(ctx, nc, cfg.Sandboxes, cfg.Concurrency, rawDur); err != nil {
		return mr, err
	}
	js, _ := jetstream.New(nc)
	vw, err := newViewWaiter(ctx, js)
	if err != nil {
		return mr, err
	}
	cmd := commanderFor(cfg.Transport, svc, nc, cfg.Concurrency)
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
	c0, err := readCost(svc.Server())
	if err != nil {
		return mr, err
	}
	stopProbe := probeHost()
	step := viewStep(cmd, vw)
	if cfg.Transport == "http" {
		// Over HTTP the closed loop's clients learn each outcome as users
		// do, from the command's own answer (?wait=true), not from a watch of the
		// view of their own (the open loops below still use that watch:
		// they time an offered rate, not a client).
		step = waitStep(httpClient(svc, cfg.Concurrency))
	}
	loop, err := cycle(ctx, step, ids, cfg.Concurrency, cfg.Duration)
	host := stopProbe()
	stopProfile()
	if err != nil {
		return mr, err
	}
	transitions, secs := loop.transitions, loop.secs
	c1, err := readCost(svc.Server())
	if err != nil {
		return mr, err
	}
	after, viewsAfter, err := logAndViewSeqs(ctx, js)
	if err != nil {
		return mr, err
	}
	mr.Pipeline = Pipeline{
		Transport: cfg.Transport, Sandboxes: cfg.Sandboxes, Concurrency: cfg.Concurrency, Seconds: secs,
		Transitions: transitions, Events: after - before, TransitionsPerS: float64(transitions) / secs,
		EventsPerS: float64(after-before) / secs, CreateToReadyPerS: createRate, ViewWrites: viewsAfter - viewsBefore,
	}
	mr.Pipeline.CPUMsPerTransition, mr.Pipeline.CoresBusy, mr.Pipeline.ServerMsgsPerEvent = c1.spent(c0, int(transitions), after-before)
	mr.Pipeline.P50, mr.Pipeline.P90, mr.Pipeline.P99, _ = percentiles(loop.lats)
	mr.Pipeline.Host = host

	// The closed loop again, over HTTP with the SDK's ?wait=true, on the same
	// sandboxes (the closed loop leaves every one ready), without the
	// bench's own watch of the view meanwhile.
	vw.stop()
	stopProfile, err = profile(cfg, fsync+".http")
	if err != nil {
		return mr, err
	}
	mr.HTTP, err = httpLoop(ctx, svc, ids, cfg.Concurrency, cfg.Duration)
	stopProfile()
	if err != nil {
		return mr, err
	}
	if vw, err = newViewWaiter(ctx, js); err != nil {
		return mr, err
	}
	if mr.Pipeline.TransitionsPerS > 0 && mr.Pipeline.P50 > 0 {
		mr.Ratios["http_vs_closed_loop_transitions"] = mr.HTTP.TransitionsPerS / mr.Pipeline.TransitionsPerS
		mr.Ratios["http_vs_closed_loop_p50"] = mr.HTTP.P50 / mr.Pipeline.P50
	}

	// The open loops: the figure at half the closed loop's rate (or
	// --rate), then the run at half busy that the p99 target is judged on,
	// its rate found from the first one's cost.
	open := opener{cmd: cmd, vw: vw, mix: newMix(ids), ns: svc.Server()}
	rate := mr.Pipeline.TransitionsPerS / 2
	if cfg.Rate > 0 {
		rate = cfg.Rate
	}
	if mr.Latency, err = open.run(ctx, rate, cfg.Duration); err != nil {
		return mr, err
	}
	if mr.Latency.CoresBusy > 0 { // zero where this OS gives no CPU time
		calib := min(cfg.Duration/3, 2*time.Second)
		mr.Busy, err = open.halfBusy(ctx, rate, mr.Latency.CoresBusy, mr.Pipeline.TransitionsPerS, calib, cfg.Duration)
		if err != nil {
			return mr, err
		}
	}
	raw, err := rawAppendLatency(ctx, nc, cfg.Sandboxes, mr.Latency.OfferedPerS, min(cfg.Duration/3, 3*time.Second))
	if err != nil {
		return mr, err
	}
	mr.Raw.AppendLatency = &raw

	// The bare round trips last, so that nothing they leave behind (grown
	// heaps, goroutines, connections closing) is in the timed runs above.
	ht, br, err := roundTrips(ctx, nc, cfg.Concurrency, rawDur)
	if err != nil {
		return mr, err
	}
	mr.Raw.HTTPRoundTrip, mr.Raw.BusRequest = &ht, &br
	// Transitions per CPU second over HTTP next to the bus's: what the HTTP
	// loop did, and the most the bare round trips allow it (httpCeiling).
	if p, h := mr.Pipeline.CPUMsPerTransition, mr.HTTP.CPUMsPerTransition; p > 0 && h > 0 {
		mr.Ratios["http_vs_closed_loop_per_cpu"] = p / h
		if c := httpCeiling(p, ht, br); c > 0 {
			mr.Ratios["http_ceiling_vs_closed_loop_per_cpu"] = c
		}
	}
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

// commanderFor is the command path of transport to svc, for conns clients.
func commanderFor(transport string, svc Service, nc *nats.Conn, conns int) commander {
	if transport == "http" {
		return httpCommander{c: httpClient(svc, conns)}
	}
	return busCommander{nc: nc}
}

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

// lastSeq is the last sequence of stream.
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

// connectAgain opens another connection like nc: its server, its user.
func connectAgain(nc *nats.Conn) (*nats.Conn, error) {
	o := nc.Opts
	return o.Connect()
}
