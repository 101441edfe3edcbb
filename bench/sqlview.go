package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/projections"
	"github.com/torpor/torpor/projections/sqlview"
)

// SQLView is the SQL view's section (with --database-url): the view applied
// live beside a closed-loop pipeline run (its apply rate and how far behind
// the log it is), then rebuilt from the whole log, each next to the raw
// batched upsert measured in the same section.
type SQLView struct {
	// Events is how many events the log held at the end of the live run.
	Events uint64 `json:"events"`
	// PipelineEPS is what the pipeline appended during the live run;
	// LiveEPS what the SQL view applied meanwhile.
	PipelineEPS float64 `json:"pipeline_events_per_s"`
	LiveEPS     float64 `json:"live_apply_events_per_s"`
	// Lag is how long the oldest event not yet in the SQL view had been in
	// the log, sampled every lagEvery during the live run.
	Lag Percentiles `json:"live_lag_ms"`
	// RebuildEPS is the rebuild of torpor replay --view sql (sqlview's
	// Rebuild: the whole log folded into new tables, caught up and swapped
	// in); RawUpsertRowsPerS the raw batched upsert of view rows measured
	// just before it.
	RebuildEPS        float64 `json:"rebuild_events_per_s"`
	RebuildSeconds    float64 `json:"rebuild_seconds"`
	RawUpsertRowsPerS float64 `json:"raw_upsert_rows_per_s"`
}

// lagEvery is how often the live run samples the SQL view's lag.
const lagEvery = 20 * time.Millisecond

// sqlBenchSchema is the schema the section's view lives in: dropped before
// and after, so that nothing of the bench stays in the database.
const sqlBenchSchema = "torpor_bench_sqlview"

// RunSQLView measures the SQL view's section on a fresh service (fsync
// interval, the bus transport) and the database at cfg.DatabaseURL. The
// view runs in the bench's process, on the service's log, as serve runs it
// with --projection-db: the projection runner over the log, one
// transaction per batch with its checkpoint.
func RunSQLView(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*SQLView, error) {
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, err
	}
	r := &SQLView{}
	dir, err := os.MkdirTemp("", "torpor-bench-sql-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	pool, err := benchPool(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer func() {
		_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+sqlBenchSchema+` CASCADE`)
		pool.Close()
	}()
	svc, err := start(ctx, dir, "interval")
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.Stop() }()
	nc, err := nats.Connect(svc.NATSURL(), svc.NATSOptions()...)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store, err := jsstore.New(ctx, js, jsstore.Config{DuplicateWindow: jsstore.DefaultDuplicateWindow})
	if err != nil {
		return nil, err
	}

	live, err := sqlview.New(ctx, pool, sqlview.Config{Name: "bench_live"})
	if err != nil {
		return nil, err
	}
	rctx, stopLive := context.WithCancel(ctx)
	liveDone, err := runView(rctx, store, live)
	if err != nil {
		stopLive()
		return nil, err
	}
	defer func() { stopLive(); <-liveDone }()

	vw, err := newViewWaiter(ctx, js)
	if err != nil {
		return nil, err
	}
	defer vw.stop()
	cmd := busCommander{nc: nc}
	fmt.Fprintf(progress, "bench: sql view: live beside %d sandboxes × %d clients for %s, then a rebuild\n", cfg.Sandboxes, cfg.Concurrency, cfg.Duration)
	ids, _, err := createReady(ctx, cmd, vw, cfg.Sandboxes, cfg.Concurrency)
	if err != nil {
		return nil, err
	}
	if err := sqlCaughtUp(ctx, store, live, time.Minute); err != nil {
		return nil, err
	}
	head0, _ := store.LastSeq(ctx)
	cp0, _ := live.Checkpoint(ctx)
	sampling := sampleLag(ctx, store, live)
	t0 := time.Now()
	if _, err := cycle(ctx, viewStep(cmd, vw), ids, cfg.Concurrency, cfg.Duration); err != nil {
		sampling()
		return nil, err
	}
	secs := time.Since(t0).Seconds()
	lags := sampling()
	head1, _ := store.LastSeq(ctx)
	cp1, _ := live.Checkpoint(ctx)
	r.Events, r.PipelineEPS, r.LiveEPS, r.Lag = head1, float64(head1-head0)/secs, float64(cp1-cp0)/secs, percentilesOf(lags)
	if err := sqlCaughtUp(ctx, store, live, time.Minute); err != nil {
		return nil, err
	}
	stopLive()
	<-liveDone

	raw, err := measureSQLUpsert(ctx, cfg.DatabaseURL, cfg.Sandboxes, sqlBenchRowsPerTx, min(cfg.Duration, 3*time.Second))
	if err != nil {
		return nil, err
	}
	r.RawUpsertRowsPerS = raw.RowsPerS
	// The rebuild torpor replay --view sql runs: the whole log folded in
	// memory into new tables, caught up, swapped in.
	t0 = time.Now()
	st, err := live.Rebuild(ctx, store, projections.RebuildOptions{})
	r.RebuildSeconds = time.Since(t0).Seconds()
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	if st.LastSeq != head1 {
		return nil, fmt.Errorf("rebuild: the tables hold the log up to %d, want %d", st.LastSeq, head1)
	}
	r.RebuildEPS = float64(head1) / r.RebuildSeconds
	return r, nil
}

// benchPool is a pool on url whose connections use the section's schema,
// made afresh.
func benchPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = sqlBenchSchema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+sqlBenchSchema+` CASCADE; CREATE SCHEMA `+sqlBenchSchema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("schema %s: %w", sqlBenchSchema, err)
	}
	return pool, nil
}

// runView runs the projection runner of v over store until ctx ends; the
// channel is closed when it has.
func runView(ctx context.Context, store *jsstore.Store, v *sqlview.View) (<-chan struct{}, error) {
	runner, err := projections.NewRunner(store, v, projections.Config{})
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = runner.Run(ctx)
	}()
	return done, nil
}

// sqlCaughtUp waits until v holds the log up to its head, for at most d.
func sqlCaughtUp(ctx context.Context, store *jsstore.Store, v *sqlview.View, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		head, err := store.LastSeq(ctx)
		if err != nil {
			return err
		}
		cp, err := v.Checkpoint(ctx)
		if err != nil {
			return err
		}
		if cp >= head {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the SQL view is at %d of %d after %s", cp, head, d)
		}
		time.Sleep(lagEvery)
	}
}

// sampleLag samples, every lagEvery until the returned function is called,
// the log's head and the view's checkpoint; the function returns each
// sample's lag: how long before it the head first passed the checkpoint
// (the oldest event the view lacked was in the log by then), zero when the
// view held the head.
func sampleLag(ctx context.Context, store *jsstore.Store, v *sqlview.View) func() []time.Duration {
	type sample struct {
		at       time.Time
		head, cp uint64
	}
	var (
		mu      sync.Mutex
		samples []sample
		stop    = make(chan struct{})
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		t := time.NewTicker(lagEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			head, err1 := store.LastSeq(ctx)
			cp, err2 := v.Checkpoint(ctx)
			if err1 == nil && err2 == nil {
				mu.Lock()
				samples = append(samples, sample{time.Now(), head, cp})
				mu.Unlock()
			}
		}
	}()
	return func() []time.Duration {
		close(stop)
		<-done
		var lags []time.Duration
		for i, s := range samples {
			if s.cp >= s.head {
				lags = append(lags, 0)
				continue
			}
			// The first sample whose head was past s.cp.
			j := slices.IndexFunc(samples[:i+1], func(o sample) bool { return o.head > s.cp })
			lags = append(lags, s.at.Sub(samples[j].at))
		}
		return lags
	}
}
