package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/services/compute"
)

// actives are the sandbox.active events of id's log, in order.
func actives(t *testing.T, r *rig, id string) []events.Envelope {
	t.Helper()
	envs, err := r.store.Load(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Envelope
	for _, env := range envs {
		if env.Type == events.TypeActive {
			out = append(out, env)
		}
	}
	return out
}

// activeSource is the source of a sandbox.active.
func activeSource(t *testing.T, env events.Envelope) events.Active {
	t.Helper()
	e, err := env.Decode()
	if err != nil {
		t.Fatal(err)
	}
	return *e.(*events.Active)
}

// counted is the value of torpor_activity_total{source} in m's text.
func counted(t *testing.T, m *metrics.Set, source string) string {
	t.Helper()
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	prefix := `torpor_activity_total{source="` + source + `"} `
	for _, l := range strings.Split(w.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			return v
		}
	}
	return "0"
}

// TestTouchOncePerWindow: a touch records one sandbox.active (source touch,
// at the touch's time) and answers 202 with the view, last_active_at set; a
// second touch within the activity window appends nothing and answers 202
// too; one after the window records another. The metric counts the events
// appended, not the touches.
func TestTouchOncePerWindow(t *testing.T) {
	r := newRig(t)
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	svc := clocked(t, r, &now)
	m := metrics.New()
	svc.cfg.Metrics = m
	v := readySandbox(t, svc)
	srv := httptest.NewServer(NewHTTP(svc, blockingViews{}, nil, zerolog.Nop()))
	t.Cleanup(srv.Close)
	touch := func(body string) events.View {
		t.Helper()
		resp, err := http.Post(srv.URL+"/v1/sandboxes/"+v.ID+"/touch", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("touch %q: %d %s, want 202", body, resp.StatusCode, data)
		}
		var got events.View
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	now = now.Add(time.Second)
	first := now
	got := touch("")
	if n := len(actives(t, r, v.ID)); n != 1 {
		t.Fatalf("after a touch: %d sandbox.active, want 1", n)
	}
	if !got.LastActiveAt.Equal(first) || got.ID != v.ID || got.Phase != events.PhaseReady {
		t.Fatalf("touch answered %+v; want the ready view, last_active_at %s", got, first)
	}
	if a := activeSource(t, actives(t, r, v.ID)[0]); a.Source != events.ActiveTouch || !a.At.Equal(first) {
		t.Fatalf("sandbox.active %+v, want source touch at %s", a, first)
	}

	now = now.Add(DefaultActivityWindow - time.Second)
	got = touch("{}")
	if n := len(actives(t, r, v.ID)); n != 1 {
		t.Fatalf("a second touch within the window: %d sandbox.active, want still 1", n)
	}
	if !got.LastActiveAt.Equal(first) {
		t.Fatalf("second touch answered last_active_at %s, want %s", got.LastActiveAt, first)
	}

	now = now.Add(time.Second) // the window since the first is over
	got = touch("")
	as := actives(t, r, v.ID)
	if len(as) != 2 {
		t.Fatalf("a touch after the window: %d sandbox.active, want 2", len(as))
	}
	if !got.LastActiveAt.Equal(now) || !as[1].Time.Equal(now) {
		t.Fatalf("third touch: last_active_at %s, event at %s; want %s", got.LastActiveAt, as[1].Time, now)
	}
	if c := counted(t, m, events.ActiveTouch); c != "2" {
		t.Fatalf("torpor_activity_total{source=touch} %s, want 2", c)
	}
}

// TestTouchRefused: a touch of an unknown sandbox is NOT_FOUND, of one in
// deleting or a terminal phase FAILED_PRECONDITION, and a body with
// another command's options INVALID_ARGUMENT; nothing is appended.
func TestTouchRefused(t *testing.T) {
	r := newRig(t)
	svc := r.service(t)
	ctx := context.Background()
	srv := httptest.NewServer(NewHTTP(svc, blockingViews{}, nil, zerolog.Nop()))
	t.Cleanup(srv.Close)

	errored := readySandbox(t, svc)
	if err := svc.Record(ctx, events.Envelope{SandboxID: errored.ID}, "test", &events.Exited{Generation: 1, Code: 3}); err != nil {
		t.Fatal(err)
	}
	deleting := readySandbox(t, svc)
	if _, err := svc.Handle(ctx, Command{Verb: VerbDelete, ID: deleting.ID}); err != nil {
		t.Fatal(err)
	}
	ready := readySandbox(t, svc)
	for _, c := range []struct {
		name, id, body string
		code           events.Code
	}{
		{"unknown", "0193b0a4-0000-7000-8000-00000000dead", "", events.CodeNotFound},
		{"error", errored.ID, "", events.CodeFailedPrecondition},
		{"deleting", deleting.ID, "", events.CodeFailedPrecondition},
		{"a resume's option", ready.ID, `{"restart_if_restore_fails":true}`, events.CodeInvalidArgument},
		{"an unknown field", ready.ID, `{"source":"forward"}`, events.CodeInvalidArgument},
		{"not an id", "nope", "", events.CodeInvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := do(t, http.MethodPost, srv.URL+"/v1/sandboxes/"+c.id+"/touch", c.body)
			if code != c.code.HTTPStatus() || body.Error == nil || body.Error.Code != c.code {
				t.Fatalf("touch: %d %+v, want %d %s", code, body.Error, c.code.HTTPStatus(), c.code)
			}
		})
	}
	for _, id := range []string{errored.ID, deleting.ID, ready.ID} {
		if n := len(actives(t, r, id)); n != 0 {
			t.Errorf("sandbox %s: %d sandbox.active after refused touches, want 0", id, n)
		}
	}
}

// TestTouchIdempotencyKey: a keyed touch retried after the window answers
// the first answer and appends nothing, as any keyed command.
func TestTouchIdempotencyKey(t *testing.T) {
	r := newRig(t)
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	svc := clocked(t, r, &now)
	v := readySandbox(t, svc)
	ctx := context.Background()
	first, err := svc.Handle(ctx, Command{Verb: VerbTouch, ID: v.ID, IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * DefaultActivityWindow)
	again, err := svc.Handle(ctx, Command{Verb: VerbTouch, ID: v.ID, IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(actives(t, r, v.ID)); n != 1 || again.Seq != first.Seq {
		t.Fatalf("keyed touch retried after the window: %d sandbox.active, answer seq %d; want 1 and the first answer's %d", n, again.Seq, first.Seq)
	}
	if _, err := svc.Handle(ctx, Command{Verb: VerbTouch, ID: v.ID, IdempotencyKey: "k2"}); err != nil {
		t.Fatal(err)
	}
	if n := len(actives(t, r, v.ID)); n != 2 {
		t.Fatalf("another key after the window: %d sandbox.active, want 2", n)
	}
}

// TestActiveAcrossInstances: activity reported to two gateways over one
// log, each holding the sandbox in its cache, lands once per window: the
// second sees the first's event at the log's head (or meets it as a
// conflict) and appends nothing. A forward's activity carries its source
// and the time it was seen, and no command id.
func TestActiveAcrossInstances(t *testing.T) {
	r := newRig(t)
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	a, b := clocked(t, r, &now), clocked(t, r, &now)
	ma, mb := metrics.New(), metrics.New()
	a.cfg.Metrics, b.cfg.Metrics = ma, mb
	v := readySandbox(t, a)
	ctx := context.Background()
	if _, err := b.Sandbox(ctx, v.ID); err != nil { // b caches it, before a's activity
		t.Fatal(err)
	}
	seen := now.Add(-time.Second)
	if err := a.Active(ctx, v.ID, events.ActiveForward, "forward", seen); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	if err := b.Active(ctx, v.ID, events.ActiveForward, "forward", now); err != nil {
		t.Fatal(err)
	}
	as := actives(t, r, v.ID)
	if len(as) != 1 {
		t.Fatalf("activity on two instances within a window: %d sandbox.active, want 1", len(as))
	}
	if e := activeSource(t, as[0]); e.Source != events.ActiveForward || !e.At.Equal(seen) || as[0].CommandID != "" || as[0].Actor != "forward" {
		t.Fatalf("sandbox.active %+v (%+v); want source forward at %s, actor forward, no command id", e, as[0], seen)
	}
	if ca, cb := counted(t, ma, events.ActiveForward), counted(t, mb, events.ActiveForward); ca != "1" || cb != "0" {
		t.Fatalf("torpor_activity_total{source=forward}: %s and %s, want 1 and 0", ca, cb)
	}
	now = now.Add(DefaultActivityWindow)
	if err := b.Active(ctx, v.ID, events.ActiveSupervisor, "supervisor:1", now); err != nil {
		t.Fatal(err)
	}
	if n := len(actives(t, r, v.ID)); n != 2 {
		t.Fatalf("activity after the window: %d sandbox.active, want 2", n)
	}
	sb, err := a.Sandbox(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sb, err = a.refresh(ctx, sb); err != nil || !sb.View.LastActiveAt.Equal(now) {
		t.Fatalf("view %+v, %v: last_active_at want %s", sb.View, err, now)
	}
	if err := a.Active(ctx, "0193b0a4-0000-7000-8000-00000000dead", events.ActiveForward, "forward", now); events.CodeOf(err) != events.CodeNotFound {
		t.Fatalf("activity of an unknown sandbox: %v, want NOT_FOUND", err)
	}
}

// TestBusyHeartbeatIsActivity: a heartbeat of the attached supervisor that
// says its workload was busy is activity (sandbox.active, source
// supervisor, actor supervisor:<gen>), once per window; a beat that does
// not say so, or one refused (another generation), records none.
func TestBusyHeartbeatIsActivity(t *testing.T) {
	r := newRig(t)
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	svc := clocked(t, r, &now)
	v := readySandbox(t, svc)
	ctx := context.Background()
	beat := func(gen int64, active bool) error {
		t.Helper()
		body, _ := json.Marshal(compute.Report{SandboxID: v.ID, Generation: gen, Credential: r.creds.Mint(v.ID, gen), Kind: compute.ReportHeartbeat, Active: active})
		_, err := svc.Report(ctx, v.ID, body)
		return err
	}
	if err := beat(1, false); err != nil {
		t.Fatal(err)
	}
	if err := beat(2, true); events.CodeOf(err) != events.CodeFailedPrecondition {
		t.Fatalf("a busy beat of another generation: %v, want FAILED_PRECONDITION", err)
	}
	if n := len(actives(t, r, v.ID)); n != 0 {
		t.Fatalf("idle beats and a refused one: %d sandbox.active, want 0", n)
	}
	for range 3 {
		if err := beat(1, true); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
	}
	as := actives(t, r, v.ID)
	if len(as) != 1 {
		t.Fatalf("three busy beats within the window: %d sandbox.active, want 1", len(as))
	}
	if e := activeSource(t, as[0]); e.Source != events.ActiveSupervisor || as[0].Actor != "supervisor:1" {
		t.Fatalf("sandbox.active %+v by %s; want source supervisor, actor supervisor:1", e, as[0].Actor)
	}
}
