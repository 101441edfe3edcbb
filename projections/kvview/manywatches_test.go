package kvview

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// TestManyWatchesKeepTheConnection: many watches whose clients are slow,
// each starting with the current view of every sandbox, never cost the
// service its connection to the bus: the server never cuts it as a slow
// consumer. To the scale of a test, the server's limit on a connection's
// pending bytes is 2 MiB here (64 MiB by default) and the follower pulls
// at most 2 × 128 KiB at once (16 × 1 MiB); with a push consumer per watch
// (what it did before) the server cut the connection in every run.
func TestManyWatchesKeepTheConnection(t *testing.T) {
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		MaxPending: 2 << 20, NoLog: true, NoSigs: true}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	var drops atomic.Int64
	nc, err := nats.Connect(ns.ClientURL(), nats.DisconnectErrHandler(func(c *nats.Conn, err error) {
		if c.IsClosed() {
			return
		}
		drops.Add(1)
		t.Logf("the service's connection dropped: %v", err)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	v := newView(t, js)
	const sandboxes, watches = 1000, 50
	pad := strings.Repeat("x", 200)
	ctx := context.Background()
	for i := range sandboxes {
		id := newID(t)
		b, _ := json.Marshal(events.View{ID: id, Name: "n" + pad, Phase: events.PhaseReady, Seq: uint64(i + 1), Labels: map[string]string{"pad": pad}})
		if _, err := v.kv.Put(ctx, id, b); err != nil {
			t.Fatal(err)
		}
	}
	fctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	f := v.Follow(fctx)
	f.pulls, f.pullBytes = make(chan struct{}, 2), 128<<10
	// Every watch is made before any is read: their clients are slow.
	chans := make([]<-chan events.View, watches)
	for i := range chans {
		if chans[i], err = f.Watch(fctx, 0); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	var wg sync.WaitGroup
	got := make([]int, watches)
	for i, ch := range chans {
		wg.Go(func() {
			for range ch {
				if got[i]++; got[i] == sandboxes {
					return
				}
			}
		})
	}
	wg.Wait() // each watch got every sandbox's view, or was ended
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Errorf("the service's connection: %v", err)
	}
	if n := drops.Load(); n > 0 {
		t.Fatalf("the service's connection dropped %d times (the server counts %d slow consumers)", n, ns.NumSlowConsumers())
	}
	for i, n := range got {
		if n != sandboxes {
			t.Fatalf("watch %d ended after %d views of %d sandboxes", i, n, sandboxes)
		}
	}
}
