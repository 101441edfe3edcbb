package kvview

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
)

// TestFreshWatchUnderLiveWrites: a fresh watch starts with the current view
// of every sandbox, also while other views are written: every view written
// before the watch began comes on it (from its start or as a change). The
// writers here put new views (each written once) and rewrite a few hot ones
// from several goroutines, so that values are replaced ahead of the
// snapshot's reader; the server's pending count then runs low, and a
// snapshot that stopped at "nothing pending" left views out that no later
// change would bring.
func TestFreshWatchUnderLiveWrites(t *testing.T) {
	srv := natstest.Start(t)
	v := newView(t, srv.JS)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var seq atomic.Uint64
	put := func(id string) {
		data, _ := json.Marshal(events.View{ID: id, Phase: events.PhaseReady, Seq: seq.Add(1)})
		if _, err := v.kv.Put(ctx, id, data); err != nil && ctx.Err() == nil {
			t.Errorf("put %s: %v", id, err)
		}
	}
	var (
		mu      sync.Mutex
		written []string // views written once, in order
	)
	for range 500 {
		id := newID(t)
		put(id)
		written = append(written, id)
	}
	hot := make([]string, 20)
	for i := range hot {
		hot[i] = newID(t)
		put(hot[i])
	}
	f := v.Follow(ctx)
	select {
	case <-f.up:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not come up")
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				put(hot[(i+w)%len(hot)])
				if i%4 == w {
					id := newID(t)
					put(id)
					mu.Lock()
					written = append(written, id)
					mu.Unlock()
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	for round := range 20 {
		mu.Lock()
		want := append([]string(nil), written...)
		mu.Unlock()
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		ch, err := f.Watch(wctx, 0)
		if err != nil {
			wcancel()
			t.Fatal(err)
		}
		missing := make(map[string]bool, len(want))
		for _, id := range want {
			missing[id] = true
		}
		for len(missing) > 0 {
			view, ok := <-ch
			if !ok {
				break
			}
			delete(missing, view.ID)
		}
		wcancel()
		if len(missing) > 0 {
			t.Fatalf("round %d: %d of the %d views written before the watch never came on it", round, len(missing), len(want))
		}
	}
}
