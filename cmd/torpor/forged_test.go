package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/events/storetest"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/node"
)

// TestForgedEventsMoveNoView (issue 23, attacks 5 and 10): well-formed
// events the lifecycle table refuses, appended with the concurrency check
// on a live (stopped) sandbox's subject and stamped with the phases a
// reader trusting the stamp would show (suspended, deleted, error, a bogus
// one, starting with data that is not an object), move neither the KV
// view nor ?at=, and the checker passes over them; each is counted. A
// well-formed event on torpor.sandbox.ZZ is foreign: no sandbox, counted.
func TestForgedEventsMoveNoView(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	nc := busConn(t, a)
	ctx := context.Background()

	v, err := c.Create(ctx, torpor.CreateRequest{Name: "victim", Driver: "sim"}, "")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := v.ID
	mustWait(t, c, id, events.PhaseReady)
	if _, err := c.Lifecycle(ctx, "stop", id, false, ""); err != nil {
		t.Fatalf("stop: %v", err)
	}
	before := mustWait(t, c, id, events.PhaseStopped)
	if kv := kvView(t, nc, id); kv.Seq != before.Seq {
		t.Fatalf("the KV view is at %d, the wait at %d", kv.Seq, before.Seq)
	}

	forged := storetest.Forged(id, before.Generation, time.Now())
	var last uint64
	for _, f := range forged {
		head, err := a.Store().Head(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if last, err = a.Store().Append(ctx, id, head, f); err != nil {
			t.Fatalf("append forged %s: %v", f.Type, err)
		}
	}
	// A well-formed creation on a subject whose id is not a sandbox id.
	zz, err := events.NewEnvelope("ZZ", &events.Created{Name: "phantom", Driver: "sim", Generation: 1}, events.Meta{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	zz.Phase = events.PhaseProvisioning
	body, _ := json.Marshal(zz)
	if err := nc.PublishMsg(&nats.Msg{Subject: jsstore.Subject("ZZ"), Data: body,
		Header: nats.Header{jsstore.HeaderType: []string{zz.Type}}}); err != nil {
		t.Fatal(err)
	}

	// ?at= the last forged event: the fold passes over all of them.
	at, err := c.GetAt(ctx, id, strconvU(last))
	if err != nil {
		t.Fatalf("get at %d: %v", last, err)
	}
	if at.Phase != events.PhaseStopped || at.Seq != before.Seq || at.ExitCode != nil || at.Restore.Held {
		t.Errorf("at %d: %+v; want the view before the forged events (stopped at %d)", last, at, before.Seq)
	}
	if n := a.Service().PassedOver(); n < uint64(len(forged)) {
		t.Errorf("the gateway passed over %d events, want at least %d", n, len(forged))
	}

	// A real start after them: the KV view applies it, so it has read past
	// the forged events, each of which it parked.
	if _, err := c.Lifecycle(ctx, "start", id, false, ""); err != nil {
		t.Fatalf("start after the forged events: %v", err)
	}
	after := mustWait(t, c, id, events.PhaseReady)
	if kv := kvView(t, nc, id); kv.Phase != events.PhaseReady || kv.Generation != before.Generation+1 || kv.ExitCode != nil || kv.Restore.Held {
		t.Errorf("the KV view after the start: %+v", kv)
	}
	if after.Generation != before.Generation+1 {
		t.Errorf("after the start: generation %d, want %d", after.Generation, before.Generation+1)
	}
	if n := a.Projection().Parked(); n != uint64(len(forged)) {
		t.Errorf("the KV view parked %d events, want %d", n, len(forged))
	}

	// The checker passes over them, counting each, and finds nothing
	// (startApp checks the whole log again at cleanup, ZZ included).
	refused := 0
	vs, err := check.Replay(ctx, a.Store(), check.Options{Refused: func(events.Envelope, error) { refused++ }})
	if err != nil || len(vs) != 0 {
		t.Errorf("check: %v, %v", vs, err)
	}
	if refused != len(forged) {
		t.Errorf("the checker passed over %d events, want %d", refused, len(forged))
	}

	// No phantom sandbox; the foreign message is counted.
	page, err := c.List(ctx, "", "", 100, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range page.Items {
		if s.ID == "ZZ" || s.Name == "phantom" {
			t.Errorf("a phantom sandbox is listed: %+v", s)
		}
	}
	if a.Store().Foreign() == 0 {
		t.Errorf("the foreign message on torpor.sandbox.ZZ was not counted")
	}
}

// TestBadCredentialSecretReplaced (issue 23, attack 7): a short or garbage
// credential_secret in torpor_config does not stop serve from starting: it
// is replaced by a fresh one at its revision.
func TestBadCredentialSecretReplaced(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	if _, err := node.Credentials(ctx, srv.JS, 1); err != nil {
		t.Fatal(err)
	}
	kv, err := srv.JS.KeyValue(ctx, "torpor_config")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"short", ""} {
		if _, err := kv.Put(ctx, "credential_secret", []byte(bad)); err != nil {
			t.Fatal(err)
		}
		if _, err := node.Credentials(ctx, srv.JS, 1); err != nil {
			t.Fatalf("credentials over %q: %v", bad, err)
		}
		e, err := kv.Get(ctx, "credential_secret")
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Value()) < 16 {
			t.Errorf("the secret after a start over %q is %d bytes", bad, len(e.Value()))
		}
	}
}

// TestGarbageInBuckets (issue 23, attacks 6 and 7): garbage in
// torpor_phases answers no 500 on list, /v1/phases or /metrics, keeps
// /readyz ready, and the next event of that sandbox rebuilds its view from
// the log while the others go on; garbage positions (the sagas' and the
// view's) and a short credential secret do not stop serve from starting
// again.
func TestGarbageInBuckets(t *testing.T) {
	dir := t.TempDir()
	a := startApp(t, dir, nil)
	c := appClient(a)
	nc := busConn(t, a)
	ctx := context.Background()
	one, err := c.Create(ctx, torpor.CreateRequest{Name: "one"}, "")
	if err != nil {
		t.Fatal(err)
	}
	two, err := c.Create(ctx, torpor.CreateRequest{Name: "two"}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, one.ID, events.PhaseReady)
	mustWait(t, c, two.ID, events.PhaseReady)

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	phases, err := js.KeyValue(ctx, "torpor_phases")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := phases.Put(ctx, one.ID, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	base := "http://" + a.HTTPAddr()
	for _, path := range []string{"/v1/sandboxes", "/v1/phases", "/metrics", "/readyz"} {
		if code, body := httpDo(t, "GET", base+path, "", nil); code != 200 {
			t.Errorf("GET %s over garbage: %d %s", path, code, body)
		}
	}
	// The next events: the garbage sandbox's view is rebuilt, the other's
	// view moves as ever.
	for _, id := range []string{one.ID, two.ID} {
		if _, err := c.Lifecycle(ctx, "stop", id, false, ""); err != nil {
			t.Fatalf("stop %s: %v", id, err)
		}
	}
	mustWait(t, c, two.ID, events.PhaseStopped)
	if v := mustWait(t, c, one.ID, events.PhaseStopped); v.Name != "one" {
		t.Errorf("the rebuilt view: %+v", v)
	}
	if kv := kvView(t, nc, one.ID); kv.Phase != events.PhaseStopped || kv.Name != "one" {
		t.Errorf("the rebuilt KV view: %+v", kv)
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}

	srv := natstest.StartWith(t, natstest.Options{Dir: dir})
	pos, err := srv.JS.KeyValue(ctx, "torpor_positions")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pos.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := pos.Put(ctx, k, []byte("garbage")); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := srv.JS.KeyValue(ctx, "torpor_config")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Put(ctx, "credential_secret", []byte("short")); err != nil {
		t.Fatal(err)
	}
	srv.Stop()

	b := startApp(t, dir, nil)
	c = appClient(b)
	if _, err := c.Lifecycle(ctx, "start", one.ID, false, ""); err != nil {
		t.Fatalf("start after the restart: %v", err)
	}
	mustWait(t, c, one.ID, events.PhaseReady)
}
