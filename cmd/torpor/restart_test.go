package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// eventWaiter watches the log's subjects on the bus and waits for an event.
type eventWaiter struct {
	ch chan events.Envelope
}

func watchLog(t *testing.T, nc *nats.Conn) *eventWaiter {
	t.Helper()
	w := &eventWaiter{ch: make(chan events.Envelope, 1024)}
	sub, err := nc.Subscribe("torpor.sandbox.*", func(m *nats.Msg) {
		var env events.Envelope
		if json.Unmarshal(m.Data, &env) == nil {
			w.ch <- env
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

func (w *eventWaiter) wait(t *testing.T, id, typ string) {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case env := <-w.ch:
			if env.SandboxID == id && env.Type == typ {
				return
			}
		case <-timeout:
			t.Fatalf("no %s for %s in %s", typ, id, waitFor)
		}
	}
}

// TestRestartCatchesUp: the service stops with events not yet projected and a
// suspension in flight; restarted on the same data directory, the view
// catches up, the in-flight saga is re-driven, nothing is lost or duplicated.
func TestRestartCatchesUp(t *testing.T) {
	dir := t.TempDir()
	a := startApp(t, dir, func(c *serveConfig) { c.noProjection = true })
	c := torpor.New(a.HTTPAddr, nil)
	w := watchLog(t, busConn(t, a))
	ctx := context.Background()

	done, err := c.Create(ctx, torpor.CreateRequest{Name: "done"}, "")
	if err != nil {
		t.Fatal(err)
	}
	w.wait(t, done.ID, "supervisor.attached")
	if _, err := c.Lifecycle(ctx, "suspend", done.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	w.wait(t, done.ID, "sandbox.suspended")

	slow, err := c.Create(ctx, torpor.CreateRequest{Name: "slow", DriverOptions: map[string]string{"latency": "300ms"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	w.wait(t, slow.ID, "supervisor.attached")
	if _, err := c.Lifecycle(ctx, "suspend", slow.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	w.wait(t, slow.ID, "sandbox.suspend_requested")
	if err := a.Stop(); err != nil { // mid-way: the driver call is under way
		t.Fatalf("stop: %v", err)
	}

	b := startApp(t, dir, nil)
	c = torpor.New(b.HTTPAddr, nil)
	vd := mustWait(t, c, done.ID, events.PhaseSuspended)
	vs := mustWait(t, c, slow.ID, events.PhaseSuspended)
	for _, v := range []events.View{vd, vs} {
		h, count := historyCounts(t, c, v.ID)
		for typ, n := range count {
			if n != 1 {
				t.Errorf("%s: %d × %s after the restart, want 1", v.Name, n, typ)
			}
		}
		if last := h[len(h)-1]; v.Seq != last.Seq || !v.Restore.Held {
			t.Errorf("%s: view %+v, last event seq %d", v.Name, v, last.Seq)
		}
	}
	// And it goes on from there.
	if _, err := c.Lifecycle(ctx, "resume", slow.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, slow.ID, events.PhaseReady)
}
