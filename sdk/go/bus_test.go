package torpor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// connect is a NATS connection to url as a producer and dashboard that
// reconnects at once and for ever, closed at the test's cleanup.
func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	return connectAs(t, url, server.creds)
}

// connectAs is connect as the user of the credentials file creds.
func connectAs(t *testing.T, url, creds string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, torpor.Credentials(creds), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func newBus(t *testing.T, nc *nats.Conn, opts ...torpor.BusOption) *torpor.Bus {
	t.Helper()
	b, err := torpor.NewBus(nc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every verb and read over the bus; its history is the HTTP API's.
func TestBusVerbs(t *testing.T) {
	ctx := ctxFor(t)
	b := newBus(t, connect(t, server.nats))
	walk(t, ctx, busClient{b})

	v, err := b.Create(ctx, sim(), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, v.ID, events.PhaseReady); err != nil {
		t.Fatal(err)
	}
	got, err := b.History(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, err := client().History(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("history over the bus has %d events, over HTTP %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Type != w.Type || g.CommandID != w.CommandID || g.Phase != w.Phase || g.ID != w.ID {
			t.Errorf("history event %d: bus %+v, HTTP %+v", i, g, w)
		}
	}
	// WaitAfter: the view from before a command does not answer it.
	stopped, err := b.Stop(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Start(ctx, waitStopped(t, ctx, b, v.ID, stopped.Seq)); err != nil {
		t.Fatal(err)
	}
}

func waitStopped(t *testing.T, ctx context.Context, b *torpor.Bus, id string, after uint64) string {
	t.Helper()
	v, err := b.WaitAfter(ctx, id, events.PhaseStopped, after)
	if err != nil || v.Seq <= after {
		t.Fatalf("wait after %d: %+v, %v", after, v, err)
	}
	return id
}

// List pages through the bucket with its cursor.
func TestBusListPages(t *testing.T) {
	ctx := ctxFor(t)
	b := newBus(t, connect(t, server.nats))
	label := unique()
	var ids []string
	for range 3 {
		r := sim()
		r.Labels = map[string]string{"page": label}
		v, err := b.Create(ctx, r, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Wait(ctx, v.ID, events.PhaseReady); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.ID)
	}
	var got []string
	cursor := ""
	for {
		page, err := b.List(ctx, string(events.PhaseReady), "page="+label, 2, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range page.Items {
			got = append(got, v.ID)
		}
		if page.Total != 3 {
			t.Errorf("page at %q: total %d, want 3", cursor, page.Total)
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	if len(got) != 3 || got[0] != ids[0] || got[1] != ids[1] || got[2] != ids[2] {
		t.Errorf("pages of 2: %v; want %v in creation order", got, ids)
	}
	if _, err := b.List(ctx, "", "nolabel", 0, ""); !errors.Is(err, torpor.ErrInvalidArgument) {
		t.Errorf("list with a malformed label: %v; want INVALID_ARGUMENT", err)
	}
}

func TestBusErrors(t *testing.T) {
	ctx := ctxFor(t)
	nc := connect(t, server.nats)
	checkErrors(t, ctx, busClient{newBus(t, nc)})
	// A wait that ctx ends: DEADLINE_EXCEEDED.
	b := newBus(t, nc)
	v, err := b.Create(ctx, sim(), "")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := b.Wait(short, v.ID, events.PhaseSuspended); !errors.Is(err, torpor.ErrDeadlineExceeded) {
		t.Errorf("wait that times out: %v; want DEADLINE_EXCEEDED", err)
	}
	// No service on the connection's NATS: UNAVAILABLE.
	if _, err := torpor.NewBus(nil); !errors.Is(err, torpor.ErrInvalidArgument) {
		t.Errorf("NewBus(nil): %v; want INVALID_ARGUMENT", err)
	}
	// (Asked as the service: a dashboard may not ask of other buckets.)
	other := newBus(t, connectAs(t, server.nats, server.service), torpor.WithBucket("no_such_bucket"))
	if _, err := other.Get(ctx, v.ID); !errors.Is(err, torpor.ErrUnavailable) {
		t.Errorf("get from a bucket that is not there: %v; want UNAVAILABLE", err)
	}
}

// A create whose reply is lost (every connection cut as it comes) is sent
// again with the same key after the reconnect, and the sandbox is created
// once.
func TestBusRetrySameKey(t *testing.T) {
	ctx := ctxFor(t)
	p := newProxy(t, hostPort(server.nats))
	b := newBus(t, connect(t, "nats://"+p.addr()), torpor.WithRequestTimeout(time.Second))
	label := unique()
	req := sim()
	req.Labels = map[string]string{"retry": label}
	p.dropAnswer("MSG _INBOX_") // the client's own inbox (busauth.ClientInbox)
	v, err := b.Create(ctx, req, "")
	if err != nil {
		t.Fatalf("create through a lost reply: %v", err)
	}
	if p.answersDropped() != 1 {
		t.Fatalf("the proxy dropped %d replies; want the first create's", p.answersDropped())
	}
	page, err := client().List(ctx, "", "retry="+label, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 || page.Items[0].ID != v.ID {
		t.Fatalf("list by the create's label: %d sandboxes; want the one sandbox %s, created once", len(page.Items), v.ID)
	}
}

// hostPort is the host:port of a nats:// URL.
func hostPort(url string) string {
	for _, pre := range []string{"nats://", "tls://"} {
		if len(url) > len(pre) && url[:len(pre)] == pre {
			return url[len(pre):]
		}
	}
	return url
}

// A wait over the bus rides out a cut connection.
func TestBusWaitDroppedConnection(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	p := newProxy(t, hostPort(server.nats))
	b := newBus(t, connect(t, "nats://"+p.addr()))
	v := mustCreate(t, ctx, c, sim())
	mustWait(t, ctx, c, v.ID, events.PhaseReady)
	type result struct {
		v   events.View
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := b.Wait(ctx, v.ID, events.PhaseSuspended)
		done <- result{got, err}
	}()
	time.Sleep(100 * time.Millisecond) // let the watch start
	p.cut()
	if _, err := c.Suspend(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.v.Phase != events.PhaseSuspended || r.v.ID != v.ID {
			t.Fatalf("wait through a cut: %+v, %v; want the suspended view", r.v, r.err)
		}
	case <-ctx.Done():
		t.Fatal("the wait did not return")
	}
	if n := p.connections(); n < 2 {
		t.Errorf("%d connection(s) through the proxy; want a reconnect after the cut", n)
	}
}

// A watch over the bus whose connection is cut mid-stream delivers every
// change made after the cut once, in seq order per sandbox.
func TestBusWatchDroppedConnection(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	p := newProxy(t, hostPort(server.nats))
	b := newBus(t, connect(t, "nats://"+p.addr()))

	a := mustCreate(t, ctx, c, sim())
	ready := mustWait(t, ctx, c, a.ID, events.PhaseReady)
	z := mustCreate(t, ctx, c, sim())
	zReady := mustWait(t, ctx, c, z.ID, events.PhaseReady)

	rec := newRecorder()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Watch(wctx, 0, rec.fn) }()
	rec.until(t, ctx, a.ID, ready.Seq)
	rec.until(t, ctx, z.ID, zReady.Seq)

	p.cut()
	mustDo(t, ctx, c, "stop", a.ID)
	d := mustCreate(t, ctx, c, sim())
	want := map[string]uint64{
		a.ID: mustWait(t, ctx, c, a.ID, events.PhaseStopped).Seq,
		d.ID: mustWait(t, ctx, c, d.ID, events.PhaseReady).Seq,
	}
	for id, seq := range want {
		rec.until(t, ctx, id, seq)
	}
	// And once the watch is surely back: every change comes.
	mustDo(t, ctx, c, "suspend", d.ID)
	want[d.ID] = mustWait(t, ctx, c, d.ID, events.PhaseSuspended).Seq
	rec.until(t, ctx, d.ID, want[d.ID])
	if n := p.connections(); n < 2 {
		t.Errorf("%d connection(s) through the proxy; want a reconnect after the cut", n)
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

// A watch made again (as Bus.Watch does when one closes under it) delivers
// none of the views the one before delivered: each current value comes
// again from the bucket, and is dropped.
func TestBusWatchAgainDeliversNothingTwice(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	b := newBus(t, connect(t, server.nats))
	a := mustCreate(t, ctx, c, sim())
	ready := mustWait(t, ctx, c, a.ID, events.PhaseReady)
	seen := map[string]uint64{}
	first, stop := context.WithCancel(ctx)
	n := 0
	_ = b.WatchOnce(first, 0, seen, func(v events.View) error {
		n++
		if v.ID == a.ID && v.Seq >= ready.Seq {
			stop()
		}
		return nil
	})
	stop()
	if n == 0 || seen[a.ID] < ready.Seq {
		t.Fatalf("the first watch delivered %d views, %s at seq %d; want its ready view", n, a.ID, seen[a.ID])
	}
	// Nothing changes now: the second watch has nothing to deliver, then
	// one change, which it delivers.
	second, stop2 := context.WithCancel(ctx)
	defer stop2()
	var again []events.View
	errs := make(chan error, 1)
	go func() {
		errs <- b.WatchOnce(second, 0, seen, func(v events.View) error {
			again = append(again, v)
			stop2()
			return nil
		})
	}()
	time.Sleep(200 * time.Millisecond) // the current values have come and gone
	stopped := mustDo(t, ctx, c, "stop", a.ID)
	select {
	case <-errs:
	case <-ctx.Done():
		t.Fatal("the second watch never delivered the stop")
	}
	if len(again) != 1 || again[0].ID != a.ID || again[0].Seq < stopped.Seq {
		t.Errorf("the second watch delivered %+v; want only the change after the first one", again)
	}
}
