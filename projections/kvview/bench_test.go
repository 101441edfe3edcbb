package kvview

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/projections"
)

// The benchmarks share one log: benchEvents events over benchSandboxes
// sandboxes, in a stream of an in-process server with default options
// (JetStream on disk, fsync on the server's interval), written once.
const (
	benchEvents    = 200_000
	benchSandboxes = 20_000
)

var fixture struct {
	once  sync.Once
	ready bool
	dir   string
	srv   *server.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store *jsstore.Store
	envs  []events.Envelope
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixture.srv != nil {
		fixture.nc.Close()
		fixture.srv.Shutdown()
		fixture.srv.WaitForShutdown()
		_ = os.RemoveAll(fixture.dir)
	}
	os.Exit(code)
}

// benchLog starts the shared server and writes the shared log, once.
func benchLog(b *testing.B) *jsstore.Store {
	b.Helper()
	fixture.once.Do(func() {
		start := time.Now()
		dir, err := os.MkdirTemp("", "kvview-bench-")
		if err != nil {
			b.Fatal(err)
		}
		fixture.dir = dir
		srv, err := server.NewServer(&server.Options{
			ServerName: "kvview-bench", JetStream: true, StoreDir: dir,
			NoLog: true, NoSigs: true, DontListen: true,
		})
		if err != nil {
			b.Fatal(err)
		}
		srv.Start()
		fixture.srv = srv
		if !srv.ReadyForConnections(10 * time.Second) {
			b.Fatal("nats-server not ready in 10s")
		}
		if fixture.nc, err = nats.Connect("", nats.InProcessServer(srv)); err != nil {
			b.Fatal(err)
		}
		if fixture.js, err = jetstream.New(fixture.nc); err != nil {
			b.Fatal(err)
		}
		if fixture.store, err = jsstore.New(context.Background(), fixture.js, jsstore.Config{}); err != nil {
			b.Fatal(err)
		}
		fixture.envs = randomLog(b, 7, benchSandboxes, benchEvents)
		publishLog(b, fixture.js, fixture.envs)
		fixture.ready = true
		b.Logf("log of %d events over %d sandboxes written in %v", benchEvents, benchSandboxes, time.Since(start))
	})
	if !fixture.ready {
		b.Fatal("the benchmark log could not be written")
	}
	return fixture.store
}

// perSecond reports n events per iteration as events/s.
func perSecond(b *testing.B, n int, unit string) {
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), unit)
}

// freshBucket is a new bucket for one iteration, deleted when the benchmark
// ends.
func freshBucket(b *testing.B, name string) string {
	b.Helper()
	b.Cleanup(func() { _ = fixture.js.DeleteKeyValue(context.Background(), name) })
	return name
}

// BenchmarkOrderedRead is the raw rate the log can be read at: an ordered
// consumer over the whole stream, messages counted, nothing decoded.
func BenchmarkOrderedRead(b *testing.B) {
	store := benchLog(b)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		cons, err := store.Stream().OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{jsstore.SubjectPrefix + ">"},
		})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(4096))
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < benchEvents; n++ {
			if _, err := it.Next(); err != nil {
				b.Fatal(err)
			}
		}
		it.Stop()
	}
	perSecond(b, benchEvents, "events/s")
}

// BenchmarkReplay reads the log as Rebuild does, envelopes decoded, nothing
// folded.
func BenchmarkReplay(b *testing.B) {
	store := benchLog(b)
	b.ResetTimer()
	for range b.N {
		n := 0
		if _, err := store.Replay(context.Background(), 0, func(envs []events.Envelope) error {
			n += len(envs)
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if want := knownEvents(fixture.envs); n != want {
			b.Fatalf("replayed %d events, want %d (of %d, less those of a type from the future)", n, want, benchEvents)
		}
	}
	perSecond(b, benchEvents, "events/s")
}

// BenchmarkRebuild rebuilds the view of the whole log into a new bucket:
// events/s over the whole run, read and fold alone, and the view writes.
func BenchmarkRebuild(b *testing.B) {
	store := benchLog(b)
	var fold, write time.Duration
	var views int
	b.ResetTimer()
	for i := range b.N {
		stats, err := Rebuild(context.Background(), fixture.js, store, Config{Bucket: freshBucket(b, fmt.Sprintf("bench_rebuild_%d", i))})
		if err != nil {
			b.Fatal(err)
		}
		fold, write, views = fold+stats.Fold, write+stats.Write, stats.Views
	}
	perSecond(b, benchEvents, "events/s")
	b.ReportMetric(float64(benchEvents*b.N)/fold.Seconds(), "fold-events/s")
	b.ReportMetric(float64(views*b.N)/write.Seconds(), "views-written/s")
}

// BenchmarkKVApplyBatch applies the whole log, in batches of 1000 events as
// the runner delivers them, to a new bucket.
func BenchmarkKVApplyBatch(b *testing.B) {
	benchLog(b)
	envs := fixture.envs
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		v, err := New(ctx, fixture.js, Config{Bucket: freshBucket(b, fmt.Sprintf("bench_apply_%d", i))})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for rest := envs; len(rest) > 0; {
			n := min(len(rest), 1000)
			if err := v.ApplyBatch(ctx, rest[:n]); err != nil {
				b.Fatal(err)
			}
			rest = rest[n:]
		}
	}
	perSecond(b, len(envs), "events/s")
}

// BenchmarkKVRunner is the live projection end to end: the runner follows
// the whole log (a new bucket's checkpoint is 0) and feeds it to ApplyBatch,
// until the checkpoint reaches the end of the log.
func BenchmarkKVRunner(b *testing.B) {
	store := benchLog(b)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		v, err := New(context.Background(), fixture.js, Config{Bucket: freshBucket(b, fmt.Sprintf("bench_runner_%d", i))})
		if err != nil {
			b.Fatal(err)
		}
		r, err := projections.NewRunner(store, v, projections.Config{})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		reached := watchSeq(b, v, benchEvents)
		b.StartTimer()
		go func() { done <- r.Run(ctx) }()
		reached()
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	perSecond(b, benchEvents, "events/s")
}

// watchSeq watches v's checkpoint and returns a function that waits
// until it reaches seq.
func watchSeq(b *testing.B, v *View, seq uint64) (wait func()) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	w, err := v.pos.Watch(ctx, v.cpKey)
	if err != nil {
		b.Fatal(err)
	}
	return func() {
		defer cancel()
		defer stop(w)
		want := fmt.Sprint(seq)
		for {
			select {
			case e := <-w.Updates():
				if e != nil && string(e.Value()) == want {
					return
				}
			case <-ctx.Done():
				b.Fatalf("checkpoint did not reach %d", seq)
			}
		}
	}
}

// knownEvents is how many of envs a reader takes: randomLog makes one in
// fifty (and every one after a delete) of a type from the future, which
// the store passes over as foreign.
func knownEvents(envs []events.Envelope) int {
	n := 0
	for _, e := range envs {
		if e.Type != "sandbox.from_the_future" {
			n++
		}
	}
	return n
}
