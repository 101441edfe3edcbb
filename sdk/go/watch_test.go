package torpor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// A watch over HTTP whose connection is cut mid-stream reconnects and
// delivers every change made after the cut once, in seq order per sandbox.
func TestWatchHTTPDroppedConnection(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	p := newProxy(t, server.http)
	wc := torpor.New(p.addr(), nil).WithToken(server.token)

	a := mustCreate(t, ctx, c, sim())
	ready := mustWait(t, ctx, c, a.ID, events.PhaseReady)
	// z does not change after the cut: a reconnect must not deliver it again.
	z := mustCreate(t, ctx, c, sim())
	zReady := mustWait(t, ctx, c, z.ID, events.PhaseReady)

	rec := newRecorder()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- wc.Watch(wctx, 0, rec.fn) }()
	rec.until(t, ctx, a.ID, ready.Seq)
	rec.until(t, ctx, z.ID, zReady.Seq)

	p.cut()
	// Changes while the watch is (likely) away, then after it is back.
	mustDo(t, ctx, c, "stop", a.ID)
	b := mustCreate(t, ctx, c, sim())
	d := mustCreate(t, ctx, c, sim())
	want := map[string]uint64{
		a.ID: mustWait(t, ctx, c, a.ID, events.PhaseStopped).Seq,
		d.ID: mustWait(t, ctx, c, d.ID, events.PhaseReady).Seq,
	}
	mustWait(t, ctx, c, b.ID, events.PhaseReady)
	mustDo(t, ctx, c, "suspend", b.ID)
	want[b.ID] = mustWait(t, ctx, c, b.ID, events.PhaseSuspended).Seq
	for id, seq := range want {
		rec.until(t, ctx, id, seq)
	}
	if n := p.connections(); n < 2 {
		t.Errorf("the watch made %d connection(s) through the proxy; want a reconnect after the cut", n)
	}
	stop()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v; want context.Canceled once its ctx ends", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Watch did not return when its ctx ended")
	}
	checkOnceInOrder(t, rec.snapshot(), want)
}

// Watch returns fn's error as soon as fn returns one.
func TestWatchHTTPStopsOnFnError(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	mustCreate(t, ctx, c, sim())
	errStop := errors.New("enough")
	err := c.Watch(ctx, 0, func(events.View) error { return errStop })
	if !errors.Is(err, errStop) {
		t.Fatalf("Watch returned %v; want fn's error", err)
	}
}

func mustCreate(t *testing.T, ctx context.Context, c *torpor.Client, r torpor.CreateRequest) events.View {
	t.Helper()
	v, err := c.Create(ctx, r, "")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return v
}

func mustWait(t *testing.T, ctx context.Context, c *torpor.Client, id string, phase events.Phase) events.View {
	t.Helper()
	v, err := c.Wait(ctx, id, phase, waitFor)
	if err != nil {
		t.Fatalf("wait for %s to be %s: %v", id, phase, err)
	}
	return v
}

func mustDo(t *testing.T, ctx context.Context, c *torpor.Client, verb, id string) events.View {
	t.Helper()
	v, err := c.Lifecycle(ctx, verb, id, false, "")
	if err != nil {
		t.Fatalf("%s %s: %v", verb, id, err)
	}
	return v
}

// Watch from a seq delivers only views above it, on both clients.
func TestWatchAfter(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	for name, w := range map[string]torpor.Watcher{"http": c, "bus": newBus(t, connect(t, server.nats))} {
		a := mustCreate(t, ctx, c, sim())
		ready := mustWait(t, ctx, c, a.ID, events.PhaseReady)
		rec := newRecorder()
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Watch(wctx, ready.Seq, rec.fn) }()
		mustDo(t, ctx, c, "stop", a.ID)
		rec.until(t, ctx, a.ID, mustWait(t, ctx, c, a.ID, events.PhaseStopped).Seq)
		stop()
		<-done
		for _, v := range rec.snapshot() {
			if v.Seq <= ready.Seq {
				t.Errorf("%s: watch after %d delivered %s at seq %d", name, ready.Seq, v.ID, v.Seq)
			}
		}
	}
}
