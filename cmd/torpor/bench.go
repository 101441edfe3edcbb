package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/bench"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/services/node"
)

func benchCmd() *cobra.Command {
	cfg := bench.Config{StartNode: benchNode}
	var compare string // --compare
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "measure the pipeline against the raw bus, in one run, on an embedded server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			output, _ := cmd.Flags().GetString("output")
			if output != "table" && output != "json" && output != "markdown" {
				return invalid(fmt.Errorf("-o %q: want table, json or markdown", output))
			}
			// From the environment, so that `task benchmarks` measures SQL
			// where a database is at hand and the command BENCHMARKS.md
			// records carries no password.
			if !cmd.Flags().Changed("database-url") {
				cfg.DatabaseURL = os.Getenv("TORPOR_BENCH_DATABASE_URL")
			}
			if err := cfg.Validate(); err != nil {
				return invalid(err)
			}
			var before []bench.Target
			if compare != "" {
				// Read first, so that a file without targets fails the
				// bench before it runs.
				var err error
				if before, err = readTargets(compare); err != nil {
					return invalid(fmt.Errorf("--compare: %w", err))
				}
			}
			rep, err := bench.Run(cmd.Context(), cfg, benchStart, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if compare != "" {
				rep.Compare(compare, before)
			}
			switch output {
			case "markdown":
				rep.Markdown(cmd.OutOrStdout(), "go run ./cmd/torpor "+strings.Join(os.Args[1:], " "))
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			default:
				rep.Print(cmd.OutOrStdout())
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Sandboxes, "sandboxes", 1000, "sandboxes in the pipeline run")
	f.IntVar(&cfg.Concurrency, "concurrency", 64, "concurrent clients (and the raw async window)")
	f.StringVar(&cfg.Fsync, "fsync", "", "always or interval; both when empty")
	f.BoolVar(&cfg.Quick, "quick", false, "smaller sizes, and runs of at most 3s ÷ --runs")
	f.StringVar(&cfg.Transport, "transport", "bus", "command path of the closed loop: bus (outcomes from a watch of the KV view), or http (the command with ?wait=true, one round trip, as users do); with bus the closed loop also runs over HTTP, and the HTTP targets compare the two")
	f.DurationVar(&cfg.Duration, "duration", 4*time.Second, "length of each timed run (each of --runs runs has its own)")
	f.IntVar(&cfg.Runs, "runs", 3, "runs of each fsync mode, the modes alternating; each target is judged on the median of its runs, printed with each run's figure (also the restarts and replays, and the blocks of the freezers' cycles)")
	f.StringVar(&compare, "compare", "", "an earlier report (BENCHMARKS.md, or the table output) whose target lines this run's targets are printed against, one line per target: what changed")
	f.Float64Var(&cfg.Rate, "rate", 0, "transitions/s the latency figure run offers (default: half the closed loop's measured rate); the p99 target's run finds its own rate, at 50% of the cores busy")
	f.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of the closed-loop pipeline run (service and load; the first of --runs) to this file; FILE.always for the fsync always run when both run; FILE.http (FILE.always.http) for the closed loop over HTTP")
	f.StringVar(&cfg.HeapProfile, "heapprofile", "", "write the live heap's profile (inuse_space) at the growth section's smallest and largest fleet size to FILE.<size>, where it reads the heap per idle sandbox (diff them with go tool pprof -base)")
	f.BoolVar(&cfg.SkipGrowth, "skip-growth", false, "leave out the growth, replay and recovery section")
	f.BoolVar(&cfg.SkipVM, "skip-vm", false, "leave out the vm driver's section (microVMs booted, suspended and resumed through the pipeline; snapshot bytes)")
	f.BoolVar(&cfg.SkipCluster, "skip-cluster", false, "leave out the cluster section (the closed loop through three torpor nodes on three in-process NATS servers, every stream R3, next to the single node's)")
	f.BoolVar(&cfg.SkipWake, "skip-wake", false, "leave out the wake-on-traffic rows (a suspended process sandbox woken by a request through its forward, with the process section; a vm sandbox's, with the vm section)")
	f.BoolVar(&cfg.SkipProcess, "skip-process", false, "leave out the process driver's section (freeze and thaw, process sandboxes through the pipeline)")
	f.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL/CockroachDB URL (default $TORPOR_BENCH_DATABASE_URL): adds the raw batched SQL upsert (view rows and a checkpoint per transaction, in throwaway torpor_bench_ tables); the SQL rebuild row waits for the SQL view")
	return cmd
}

// readTargets is the target lines of the earlier report in file; a file
// without any is refused.
func readTargets(file string) ([]bench.Target, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ts, err := bench.ParseTargets(f)
	if err == nil && len(ts) == 0 {
		err = fmt.Errorf("%s: no target lines", file)
	}
	return ts, err
}

// benchStart is the bench's Starter: the service as serve wires it, over
// dir, on random ports, with serve's defaults but a shorter deadline.
var benchStart = benchStarter("")

// benchStarter is benchStart with the process driver's supervisors running
// the torpor binary at torpor (empty: this executable, which a test binary
// is not).
func benchStarter(torpor string) bench.Starter {
	return func(ctx context.Context, dir, fsync string, nodes ...string) (bench.Service, error) {
		a, err := start(ctx, serveConfig{Data: dir, HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Fsync: fsync, Node: "local", RemoteNodes: nodes,
			Deadline: time.Minute, DuplicateWindow: jsstore.DefaultDuplicateWindow, HeartbeatLimit: defaultHeartbeatLimit, Torpor: torpor}, zerolog.Nop())
		if err != nil {
			return nil, err
		}
		if len(nodes) == 0 {
			return a, nil
		}
		s := &benchNodes{app: a}
		for _, node := range nodes {
			data := filepath.Join(dir, "node-"+node)
			creds, err := driverCreds(a, data, node)
			if err != nil {
				_ = s.Stop()
				return nil, fmt.Errorf("torpor driver --node %s: %w", node, err)
			}
			if err := s.serve(ctx, driverConfig{Node: node, Drivers: []string{"vm"}, NATSURL: a.NATSURL(), NATSCreds: creds, Data: data,
				Heartbeat: defaultHeartbeatLimit / 3, Torpor: torpor}); err != nil {
				_ = s.Stop()
				return nil, fmt.Errorf("torpor driver --node %s: %w", node, err)
			}
		}
		return s, nil
	}
}

// benchNode is the bench's NodeStarter: the service as serve wires it
// joining a cluster (--nats-url, --nats-creds, --replicas), over dir, on a
// random HTTP port, with benchStart's settings.
func benchNode(ctx context.Context, dir, name, url, creds, fsync string, replicas int) (bench.Service, error) {
	a, err := start(ctx, serveConfig{Data: dir, HTTP: "127.0.0.1:0", NATSURL: url, NATSCreds: creds, Replicas: replicas, Fsync: fsync, Node: name,
		Deadline: time.Minute, DuplicateWindow: jsstore.DefaultDuplicateWindow, HeartbeatLimit: defaultHeartbeatLimit}, zerolog.Nop())
	if err != nil {
		return nil, err // not a nil *app in the interface
	}
	return a, nil
}

// driverCreds writes, under dir, the credentials file of node's driver
// (what `torpor creds --role driver --node N` writes) and returns its path.
func driverCreds(a *app, dir, node string) (string, error) {
	if a.Auth() == nil {
		return "", errors.New("no bus keys to mint a driver's user with")
	}
	u, err := a.Auth().User("torpor driver "+node, 24*time.Hour, busauth.Grant{Role: busauth.Driver, Node: node})
	if err != nil {
		return "", err
	}
	creds, err := u.Creds()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	file := filepath.Join(dir, "driver.creds")
	return file, os.WriteFile(file, creds, 0o600)
}

// benchNodes is the bench's service with `torpor driver`s of other nodes
// beside it, in this process (each over its own data directory and NATS
// connection, as the verb runs them).
type benchNodes struct {
	*app
	stops []func() error
}

// serve runs `torpor driver` with cfg until Stop, once it serves.
func (s *benchNodes) serve(ctx context.Context, cfg driverConfig) error {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	up, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- node.RunDriver(ctx, cfg, closeOnWrite(up), zerolog.Nop()) }()
	stop := func() error { cancel(); return <-done }
	select {
	case <-up:
		s.stops = append(s.stops, stop)
		return nil
	case err := <-done:
		cancel()
		return err
	}
}

// Stop stops the other nodes' drivers, then the service.
func (s *benchNodes) Stop() error {
	var errs []error
	for _, stop := range s.stops {
		errs = append(errs, stop())
	}
	return errors.Join(append(errs, s.app.Stop())...)
}

// closeOnWrite is a writer that closes c at its first write (serveDrivers
// says there that it serves) and discards everything.
type closeOnWrite chan struct{}

func (c closeOnWrite) Write(p []byte) (int, error) {
	select {
	case <-c:
	default:
		close(c)
	}
	return len(p), nil
}

var _ bench.Service = (*app)(nil)
