package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/internal/embedded"
	"github.com/torpor/torpor/projections/kvview"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute/sim"
	"github.com/torpor/torpor/services/gateway"
)

// GrowthRow is command latency at one fleet size and history length.
type GrowthRow struct {
	Sandboxes        int     `json:"sandboxes"`
	EventsPerSandbox int     `json:"events_per_sandbox"`
	LogEvents        int     `json:"log_events"`
	FirstTouch       Latency `json:"first_touch_ms"`
	Steady           Latency `json:"steady_ms"`
	// SteadyP50Runs is the steady p50 of each run (--runs) of the steady
	// sample, which Steady gathers.
	SteadyP50Runs []float64 `json:"steady_p50_ms_runs,omitempty"`
}

// Growth is how the service fares as the fleet and its histories grow.
type Growth struct {
	Rows                []GrowthRow `json:"rows"`
	CatchUpEPS          float64     `json:"catch_up_eps"`
	HeapPerSandboxBytes float64     `json:"heap_per_sandbox_bytes"`
	RecoverySeconds     float64     `json:"recovery_seconds"`
	RecoverySandboxes   int         `json:"recovery_sandboxes"`
	// RecoveryRuns is the restart to ready of each run (--runs), in the
	// order they ran; RecoverySeconds is their median.
	RecoveryRuns []float64 `json:"recovery_seconds_runs,omitempty"`
}

// Replay is the whole log read raw, next to a rebuild of the KV view from it.
type Replay struct {
	Events            int     `json:"events"`
	RawOrderedReadEPS float64 `json:"raw_ordered_read_eps"`
	KVRebuildEPS      float64 `json:"kv_rebuild_eps"`
	// Runs is each run's read and rebuild (--runs), which alternate; the
	// two figures above are the median run's, by rebuild ÷ read.
	Runs []ReplayRun `json:"runs,omitempty"`
}

// ReplayRun is one run's read of the whole log, and the rebuild after it.
type ReplayRun struct {
	RawOrderedReadEPS float64 `json:"raw_ordered_read_eps"`
	KVRebuildEPS      float64 `json:"kv_rebuild_eps"`
}

// history returns a settled lifecycle of about n events for sandbox id, each
// stamped with the phase the table gives: created, attached, then suspend and
// resume cycles, ending ready; and the generation it ends running. It is
// what a long-lived sandbox's log looks like.
func history(id string, n int, now time.Time) ([]events.Envelope, int64, error) {
	evs := []events.Event{
		&events.Created{Name: "bench-" + id[len(id)-12:], Driver: "sim", Node: "local", Generation: 1},
		&events.Started{Generation: 1},
		&events.SupervisorAttached{Generation: 1},
	}
	g := int64(1)
	for ; len(evs)+6 <= n; g++ {
		ref := "sim:" + id + ":" + strconv.FormatInt(g, 10) + ":bench"
		evs = append(evs,
			&events.SuspendRequested{Generation: g},
			&events.Suspended{Generation: g, RestoreRef: ref},
			&events.ResumeRequested{Generation: g + 1, RestoreRef: ref},
			&events.RetainedStateConsumed{Generation: g + 1, RestoreRef: ref},
			&events.Resumed{Generation: g + 1, Outcome: events.OutcomeRestored},
			&events.SupervisorAttached{Generation: g + 1},
		)
	}
	out := make([]events.Envelope, len(evs))
	phase := events.PhaseNone
	for i, e := range evs {
		env, err := events.NewEnvelope(id, e, events.Meta{Actor: "bench"}, now)
		if err != nil {
			return nil, 0, err
		}
		if phase, err = gateway.Next(phase, e.Type()); err != nil {
			return nil, 0, err
		}
		env.Phase = phase
		out[i] = env
	}
	return out, g, nil
}

// populate appends n settled sandboxes of about perSandbox events each
// straight to the log (async, a bounded window), then saves the sagas'
// position past them: the histories are complete, nothing is left for a
// saga to drive. It tells the sim driver under dir that each runs at the
// generation its history ends with, as the service's own sim would know. It
// returns the ids and the events written.
func populate(ctx context.Context, dir string, nc *nats.Conn, store *jsstore.Store, n, perSandbox int) ([]string, int, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, 0, err
	}
	ids := make([]string, n)
	running := make(map[string]int64, n)
	written := 0
	now := time.Now()
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7()).String()
		envs, gen, err := history(ids[i], perSandbox, now)
		if err != nil {
			return nil, 0, err
		}
		running[ids[i]] = gen
		for _, env := range envs {
			data, err := json.Marshal(env)
			if err != nil {
				return nil, 0, err
			}
			m := &nats.Msg{Subject: jsstore.Subject(ids[i]), Data: data, Header: nats.Header{jsstore.HeaderType: []string{env.Type}}}
			// No message id: this is a bulk import, and the server's
			// deduplication window would otherwise hold every id for two
			// minutes and count as heap per sandbox.
			if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(stallWait)); err != nil {
				return nil, 0, fmt.Errorf("populate: %w", err)
			}
			written++
		}
	}
	if err := asyncComplete(ctx, js, 2*time.Minute); err != nil {
		return nil, 0, fmt.Errorf("populate: %w", err)
	}
	if err := sim.Adopt(dir, running); err != nil {
		return nil, 0, fmt.Errorf("populate: %w", err)
	}
	return ids, written, settleSagas(ctx, store)
}

// settleSagas saves the saga runner's position after the last event: a
// settled history has nothing left to drive.
func settleSagas(ctx context.Context, store *jsstore.Store) error {
	last, err := store.LastSeq(ctx)
	if err != nil {
		return err
	}
	pos, err := store.Position(ctx, sagas.PositionKey("local"))
	if err != nil {
		return err
	}
	if err := pos.Set(ctx, last); err != nil {
		return fmt.Errorf("settle sagas: %w", err)
	}
	return nil
}

// poll asks ok every interval until it says yes or ctx ends.
func poll(ctx context.Context, every time.Duration, ok func() bool) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for !ok() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// caughtUp waits until the service is ready and its view has no lag.
func caughtUp(ctx context.Context, svc Service) error {
	err := poll(ctx, 20*time.Millisecond, func() bool {
		if svc.Ready(ctx) != nil {
			return false
		}
		lag, err := svc.ViewLag(ctx)
		return err == nil && lag == 0
	})
	if err != nil {
		return fmt.Errorf("view not caught up: %w", err)
	}
	return nil
}

// atRest is how long the fleet is left idle before its heap is read:
// nats-server drops a message block's cache (a buffer of up to the block's
// 8 MiB) 10 s after the block was last written or read, so right after the
// catch-up and the latency sample the server still held 30 to 130 MB of
// such caches, depending on which blocks the last seconds touched: the
// same build read 2635 or 3337 B per idle sandbox, run to run.
const atRest = 12 * time.Second

// heap is the live heap of the service at rest: after rest without
// commands (atRest; none in a --quick run, whose figure is a smoke test's
// and not judged on; ctx's end cuts it short), and two full collections, the second
// freeing what the first left in the sync.Pools' victim caches (the
// server's recycled block buffers among them).
func heap(ctx context.Context, rest time.Duration) uint64 {
	select {
	case <-time.After(rest):
	case <-ctx.Done():
	}
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// heapProfile writes the live heap's profile to file.<size>, if file is
// set. It follows heap, whose collection it shows.
func heapProfile(file string, size int) error {
	if file == "" {
		return nil
	}
	f, err := os.Create(file + "." + strconv.Itoa(size))
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// sampleLatency measures command-to-visible latency on ids with c clients.
// First every id is touched once (suspend, resume): the first command on an
// id finds a cold cache and loads its history, and is reported as first
// touch. Then, with every id warm, each goes through two more suspend →
// resume cycles, runs times over: the steady latency, not disturbed by
// other ids' cold loads, and the p50 of each run.
func sampleLatency(ctx context.Context, cmd commander, vw *viewWaiter, ids []string, c, runs int) (first, steady Latency, p50s []float64, err error) {
	cold, _, err := timeSteps(ctx, cmd, vw, ids, c, suspendResume)
	if err != nil {
		return first, steady, nil, err
	}
	// The first touches loaded whole histories (1000 events each for the
	// long ones); collect that garbage now rather than during the steady
	// sample, which is about the cost of a command, not of those loads.
	runtime.GC()
	var (
		all  []time.Duration
		secs float64
	)
	for range max(1, runs) {
		warm, el, err := timeSteps(ctx, cmd, vw, ids, c, slices.Concat(suspendResume, suspendResume))
		if err != nil {
			return first, steady, nil, err
		}
		run := slices.Concat(warm...)
		p50, _, _, _ := percentiles(slices.Clone(run))
		p50s, all, secs = append(p50s, p50), append(all, run...), secs+el
	}
	first = Latency{Percentiles: percentilesOf(cold[0])}
	steady = Latency{AchievedPerS: float64(len(all)) / secs, Percentiles: percentilesOf(all)}
	return first, steady, p50s, nil
}

// timeSteps runs steps on every id with c clients and returns the latencies
// by step index, and the seconds it took.
func timeSteps(ctx context.Context, cmd commander, vw *viewWaiter, ids []string, c int, steps []move) ([][]time.Duration, float64, error) {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		ferr error
		lats = make([][]time.Duration, len(steps))
		work = make(chan string, len(ids))
	)
	for _, id := range ids {
		work <- id
	}
	close(work)
	start := time.Now()
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				for i, mv := range steps {
					t0 := time.Now()
					err := step(ctx, cmd, vw, mv.verb, id, mv.target)
					mu.Lock()
					if err != nil {
						ferr = errors.Join(ferr, err)
						mu.Unlock()
						return
					}
					lats[i] = append(lats[i], time.Since(t0))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return lats, time.Since(start).Seconds(), ferr
}

// RunGrowth grows a log (fsync interval) through cfg.Sizes sandboxes of
// ShortHistory events, adding LongSample sandboxes of LongHistory events at
// the largest size; at each size it restarts the service, waits for the view
// to catch up, and measures command latency on a sample. Then it measures the
// restart to ready at the largest size, the heap per sandbox, and the replay.
func RunGrowth(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*Growth, *Replay, error) {
	rest := atRest
	if cfg.Quick {
		rest = 0
	}
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "torpor-bench-growth-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	g := &Growth{}
	var (
		total     int
		logEvents int
		heapSmall uint64
		catchSecs float64
	)
	for i, size := range cfg.Sizes {
		last := i == len(cfg.Sizes)-1
		nLong := 0
		if last {
			nLong = cfg.LongSample // the long histories join at the largest size
		}
		short, long, written, err := grow(ctx, dir, size-total, cfg.ShortHistory, nLong, cfg.LongHistory)
		if err != nil {
			return nil, nil, err
		}
		total, logEvents = size, logEvents+written
		fmt.Fprintf(progress, "bench: growth: %d sandboxes, %d events in the log\n", total, logEvents)

		t0 := time.Now()
		svc, err := start(ctx, dir, "interval")
		if err != nil {
			return nil, nil, err
		}
		err = caughtUp(ctx, svc)
		catchSecs += time.Since(t0).Seconds()
		if err != nil {
			_ = svc.Stop()
			return nil, nil, err
		}
		rows, err := measureGrowth(ctx, cfg, svc, short[:min(cfg.Sample, len(short))], long, total, logEvents)
		if err == nil && i == 0 {
			heapSmall = heap(ctx, rest)
			err = heapProfile(cfg.HeapProfile, size)
		}
		if err == nil && last {
			if heapLarge := heap(ctx, rest); heapLarge > heapSmall && size > cfg.Sizes[0] {
				g.HeapPerSandboxBytes = float64(heapLarge-heapSmall) / float64(size-cfg.Sizes[0])
			}
			if i > 0 {
				err = heapProfile(cfg.HeapProfile, size)
			}
		}
		_ = svc.Stop()
		if err != nil {
			return nil, nil, err
		}
		g.Rows = append(g.Rows, rows...)
	}
	g.CatchUpEPS = float64(logEvents) / catchSecs

	// Restart to ready with everything in the log, then the replay: once
	// per run, the restarts alternating with the replay's reads and
	// rebuilds.
	g.RecoverySandboxes = total
	r := &Replay{Events: logEvents}
	for range max(1, cfg.Runs) {
		secs, run, err := restartAndReplay(ctx, dir, start, logEvents)
		if err != nil {
			return nil, nil, err
		}
		g.RecoveryRuns = append(g.RecoveryRuns, secs)
		r.Runs = append(r.Runs, run)
	}
	g.RecoverySeconds = median(g.RecoveryRuns)
	m := medianRun(r.Runs, func(run ReplayRun) float64 { return run.KVRebuildEPS / run.RawOrderedReadEPS })
	r.RawOrderedReadEPS, r.KVRebuildEPS = m.RawOrderedReadEPS, m.KVRebuildEPS
	return g, r, nil
}

// restartAndReplay starts the service over dir, times its restart to
// ready, measures the replay of its log of events, and stops it.
func restartAndReplay(ctx context.Context, dir string, start Starter, events int) (float64, ReplayRun, error) {
	t0 := time.Now()
	svc, err := start(ctx, dir, "interval")
	if err != nil {
		return 0, ReplayRun{}, err
	}
	defer func() { _ = svc.Stop() }()
	if err := poll(ctx, 5*time.Millisecond, func() bool { return svc.Ready(ctx) == nil }); err != nil {
		return 0, ReplayRun{}, err
	}
	secs := time.Since(t0).Seconds()
	r, err := measureReplay(ctx, svc, events)
	if err != nil {
		return 0, ReplayRun{}, err
	}
	return secs, ReplayRun{RawOrderedReadEPS: r.RawOrderedReadEPS, KVRebuildEPS: r.KVRebuildEPS}, nil
}

// grow appends n sandboxes of short events and nLong of long events to the
// log in the data directory dir, with the service stopped.
func grow(ctx context.Context, dir string, n, short, nLong, long int) ([]string, []string, int, error) {
	// The service's bus keys (made here when the service has not run yet):
	// its streams are its account's.
	auth, err := busauth.Open(filepath.Join(dir, "auth"), busauth.NoLimits)
	if err != nil {
		return nil, nil, 0, err
	}
	user, err := auth.User("torpor bench import", 0, busauth.Grant{Role: busauth.Service})
	if err != nil {
		return nil, nil, 0, err
	}
	ns, err := embedded.Start(embedded.Config{Data: dir, Name: "torpor-bench-import", Operator: auth.OperatorJWT, Accounts: auth.Accounts(), SystemAccount: auth.SystemKey})
	if err != nil {
		return nil, nil, 0, err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := nats.Connect("", append(user.Options(), nats.InProcessServer(ns))...)
	if err != nil {
		return nil, nil, 0, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// New, not Bind: before the first size the log does not exist yet. Its
	// config is jsstore's default, the one the bench's service runs with
	// (and sets again when it starts).
	store, err := jsstore.New(ctx, js, jsstore.Config{})
	if err != nil {
		return nil, nil, 0, err
	}
	ids, written, err := populate(ctx, dir, nc, store, n, short)
	if err != nil {
		return nil, nil, 0, err
	}
	var longIDs []string
	if nLong > 0 {
		var w int
		if longIDs, w, err = populate(ctx, dir, nc, store, nLong, long); err != nil {
			return nil, nil, 0, err
		}
		written += w
	}
	return ids, longIDs, written, nil
}

// measureGrowth samples command latency on short (and long) sandboxes.
func measureGrowth(ctx context.Context, cfg Config, svc Service, short, long []string, total, logEvents int) ([]GrowthRow, error) {
	nc, err := nats.Connect(svc.NATSURL(), svc.NATSOptions()...)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	vw, err := newViewWaiter(ctx, js)
	if err != nil {
		return nil, err
	}
	clients := min(8, cfg.Concurrency)
	cmd := commanderFor(cfg.Transport, svc, nc, clients)
	var rows []GrowthRow
	for _, set := range []struct {
		ids []string
		per int
	}{{short, cfg.ShortHistory}, {long, cfg.LongHistory}} {
		if len(set.ids) == 0 {
			continue
		}
		first, steady, p50s, err := sampleLatency(ctx, cmd, vw, set.ids, clients, cfg.Runs)
		if err != nil {
			return nil, err
		}
		rows = append(rows, GrowthRow{Sandboxes: total, EventsPerSandbox: set.per, LogEvents: logEvents, FirstTouch: first, Steady: steady, SteadyP50Runs: p50s})
	}
	return rows, nil
}

// measureReplay reads the whole log with an ordered consumer, then rebuilds
// the KV view from it into a fresh bucket, on a connection of its own.
func measureReplay(ctx context.Context, svc Service, events int) (*Replay, error) {
	nc, err := nats.Connect(svc.NATSURL(), append(svc.NATSOptions(), nats.SyncQueueLen(jsstore.SyncQueueLen))...)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	store, err := jsstore.Bind(ctx, js, "")
	if err != nil {
		return nil, err
	}
	r := &Replay{Events: events}
	if r.RawOrderedReadEPS, err = orderedRead(ctx, js, jsstore.DefaultStream); err != nil {
		return nil, err
	}
	const bucket = "torpor_phases_rebuild"
	_ = js.DeleteKeyValue(ctx, bucket)
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), bucket) }()
	t0 := time.Now()
	st, err := kvview.Rebuild(ctx, js, store, kvview.Config{Bucket: bucket})
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	r.KVRebuildEPS = float64(st.Events) / time.Since(t0).Seconds()
	return r, nil
}

// latencyRuns is, for each run of the steady sample, its p50 at the
// largest fleet with the longest history over its p50 at the smallest (the
// k-th runs of the two); for rows without runs, the ratio of their p50s.
func (g *Growth) latencyRuns() []float64 {
	if len(g.Rows) < 2 {
		return nil
	}
	small, large := g.Rows[0], g.Rows[len(g.Rows)-1]
	if len(small.SteadyP50Runs) == 0 || len(small.SteadyP50Runs) != len(large.SteadyP50Runs) {
		if small.Steady.P50 > 0 {
			return []float64{large.Steady.P50 / small.Steady.P50}
		}
		return nil
	}
	var vs []float64
	for k, s := range small.SteadyP50Runs {
		if s > 0 {
			vs = append(vs, large.SteadyP50Runs[k]/s)
		}
	}
	return vs
}

// ratioRuns is the KV rebuild ÷ the raw ordered read of each run; a
// replay without runs gives the ratio of its two figures.
func (r *Replay) ratioRuns() []float64 {
	runs := r.Runs
	if len(runs) == 0 {
		runs = []ReplayRun{{RawOrderedReadEPS: r.RawOrderedReadEPS, KVRebuildEPS: r.KVRebuildEPS}}
	}
	var vs []float64
	for _, run := range runs {
		if run.RawOrderedReadEPS > 0 {
			vs = append(vs, run.KVRebuildEPS/run.RawOrderedReadEPS)
		}
	}
	return vs
}
