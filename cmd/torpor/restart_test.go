package main

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/sagas"
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
	// The server has the subscription once it answered a flush: no event
	// appended after watchLog returns is missed.
	if err := nc.Flush(); err != nil {
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

// TestRestartCatchesUp: the service stops with a suspension in flight, and
// its phase view is lost while it is down; restarted on the same data
// directory, the view is projected again from the whole log, the in-flight
// saga is re-driven, nothing is lost or duplicated.
func TestRestartCatchesUp(t *testing.T) {
	dir := t.TempDir()
	a := startApp(t, dir, nil)
	c := appClient(a)
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
	forgetView(t, dir)

	b := startApp(t, dir, nil)
	c = appClient(b)
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
	// Only the suspension in flight went to the driver again.
	if calls := b.Sim().Calls(); !maps.Equal(calls, map[string]int{"suspend": 1}) {
		t.Errorf("driver calls after the restart %v, want the one suspend in flight", calls)
	}
	// And it goes on from there.
	if _, err := c.Lifecycle(ctx, "resume", slow.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, slow.ID, events.PhaseReady)
}

// forgetView deletes the KV phase view of the stopped service over dir, and
// its checkpoint: the next start has every event of the log to project.
func forgetView(t *testing.T, dir string) {
	t.Helper()
	srv := natstest.StartWith(t, natstest.Options{Dir: dir})
	defer srv.Stop()
	ctx := t.Context()
	if err := srv.JS.DeleteKeyValue(ctx, "torpor_phases"); err != nil {
		t.Fatalf("delete the view: %v", err)
	}
	// The checkpoint, once it moves out of the view's bucket, is kvview.torpor_phases in torpor_positions.
	pos, err := srv.JS.KeyValue(ctx, "torpor_positions")
	if err != nil {
		t.Fatal(err)
	}
	if err := pos.Delete(ctx, "kvview.torpor_phases"); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("delete the view's checkpoint: %v", err)
	}
}

// TestRestartWithoutPositions: a crash before any position or checkpoint was
// saved leaves the sagas and the view to read the whole log again. Every
// intent in it is settled, so nothing is driven or appended twice, the view
// ends as it was, and the service goes on from there.
func TestRestartWithoutPositions(t *testing.T) {
	dir := t.TempDir()
	a := startApp(t, dir, nil)
	c := appClient(a)
	ctx := context.Background()
	phases := map[string]events.Phase{}
	for name, verbs := range map[string][]string{
		"kept-suspended": {"suspend"},
		"resumed":        {"suspend", "resume"},
		"stopped":        {"stop"},
	} {
		v, err := c.Create(ctx, torpor.CreateRequest{Name: name}, "")
		if err != nil {
			t.Fatal(err)
		}
		v = mustWait(t, c, v.ID, events.PhaseReady)
		for _, verb := range verbs {
			want := map[string]events.Phase{"suspend": events.PhaseSuspended, "resume": events.PhaseReady, "stop": events.PhaseStopped}[verb]
			acc, err := c.Lifecycle(ctx, verb, v.ID, false, "")
			if err != nil {
				t.Fatal(err)
			}
			if v, err = c.WaitAfter(ctx, v.ID, want, acc.Seq, waitFor); err != nil {
				t.Fatalf("%s %s: %v", verb, name, err)
			}
		}
		phases[v.ID] = v.Phase
	}
	before := map[string]map[string]int{}
	for id := range phases {
		_, before[id] = historyCounts(t, c, id)
	}
	last, err := a.Store().LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}

	// As if the service had crashed before it ever saved where it was.
	srv := natstest.StartWith(t, natstest.Options{Dir: dir})
	kv, err := srv.JS.KeyValue(ctx, "torpor_positions")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{sagas.PositionKey("local"), "kvview.torpor_phases"} {
		if _, err := kv.Put(ctx, key, []byte("0")); err != nil {
			t.Fatal(err)
		}
	}
	srv.Stop()

	b := startApp(t, dir, nil)
	c = appClient(b)
	pos, err := b.Store().Position(ctx, sagas.PositionKey("local"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		p, err := pos.Get(ctx)
		lag, lerr := b.Projection().Lag(ctx)
		if err == nil && lerr == nil && p >= last && lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sagas at %d (%v), view lag %d (%v); want both past %d", p, err, lag, lerr, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, err := b.Store().LastSeq(ctx); err != nil || got != last {
		t.Errorf("log at %d (%v) after reading it all again, want %d: something was appended", got, err, last)
	}
	if calls := b.Sim().Calls(); len(calls) != 0 {
		t.Errorf("driver calls %v while reading the log again, want none: every intent was settled", calls)
	}
	for id, phase := range phases {
		if v := mustWait(t, c, id, phase); v.Seq > last {
			t.Errorf("%s: view at seq %d past the log's %d", v.Name, v.Seq, last)
		}
		if _, after := historyCounts(t, c, id); !reflect.DeepEqual(after, before[id]) {
			t.Errorf("%s: history %v after the restart, was %v", id, after, before[id])
		}
	}
	for id, phase := range phases {
		if phase == events.PhaseSuspended {
			acc, err := c.Lifecycle(ctx, "resume", id, false, "")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.WaitAfter(ctx, id, events.PhaseReady, acc.Seq, waitFor); err != nil {
				t.Fatalf("resume after the restart: %v", err)
			}
		}
	}
}
