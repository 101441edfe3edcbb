package jsstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
)

// BenchmarkConcurrentAppends is the closed loop of the log alone: writers
// appending one event at a time, each to its own sandbox, on a file-backed
// stream synced on every write (serve --fsync always) or on the server's
// interval. It reports events/s and the messages the server took in and
// sent per event (a single append: the publish and its answer, 2).
func BenchmarkConcurrentAppends(b *testing.B) {
	for _, fsync := range []string{"always", "interval"} {
		for _, group := range []bool{false, true} {
			for _, writers := range []int{1, 4, 8, 32, 64} {
				b.Run(fmt.Sprintf("fsync=%s/group=%v/writers=%d", fsync, group, writers), func(b *testing.B) {
					benchAppends(b, fsync == "always", group, writers)
				})
			}
		}
	}
}

func benchAppends(b *testing.B, syncAlways, group bool, writers int) {
	srv := natstest.StartWith(b, natstest.Options{SyncAlways: syncAlways})
	s, err := jsstore.New(context.Background(), srv.JS, jsstore.Config{GroupCommit: group})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	envs := make([][]events.Envelope, writers)
	ids := make([]string, writers)
	for w := range writers {
		ids[w] = fmt.Sprintf("0193b0a4-0000-7000-8000-%012d", w)
		envs[w] = make([]events.Envelope, b.N/writers+1)
		for i := range envs[w] {
			envs[w][i] = envelope(b, ids[w], int64(i+1))
		}
	}
	v0 := varz(b, srv)
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range writers {
		n := b.N / writers
		if w < b.N%writers {
			n++
		}
		wg.Go(func() {
			var last uint64
			for i := range n {
				seq, err := s.Append(ctx, ids[w], last, envs[w][i])
				if err != nil {
					b.Errorf("append: %v", err)
					return
				}
				last = seq
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	v1 := varz(b, srv)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(v1.InMsgs+v1.OutMsgs-v0.InMsgs-v0.OutMsgs)/float64(b.N), "server-msgs/event")
	batches, batched := jsstore.Batched(s)
	b.ReportMetric(float64(batched)/float64(b.N), "batched/event")
	b.ReportMetric(float64(batches), "batches")
}

func varz(b *testing.B, srv *natstest.Server) *server.Varz {
	b.Helper()
	v, err := srv.Varz(nil)
	if err != nil {
		b.Fatalf("varz: %v", err)
	}
	return v
}
