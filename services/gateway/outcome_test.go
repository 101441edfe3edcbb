package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/projections/kvview"
)

// outcomeRig is the HTTP API of one service whose reads come from a KV
// view that follows the rig's log, as serve's do.
type outcomeRig struct {
	*rig
	svc  *Service
	view *kvview.View
	url  string
}

func newOutcomeRig(t *testing.T, guard HTTPGuard) *outcomeRig {
	t.Helper()
	r := newRig(t)
	ctx, cancel := context.WithCancel(context.Background())
	view, err := kvview.New(ctx, r.js, kvview.Config{})
	if err != nil {
		t.Fatal(err)
	}
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		_ = r.store.Follow(ctx, 0, 64, func(ctx context.Context, envs []events.Envelope, _ uint64) error {
			return view.ApplyBatch(ctx, envs)
		})
	}()
	svc := r.service(t)
	srv := httptest.NewServer(NewHTTP(svc, kvViews{view}, nil, zerolog.Nop()).WithGuard(guard))
	t.Cleanup(func() { srv.Close(); cancel(); <-followed })
	return &outcomeRig{rig: r, svc: svc, view: view, url: srv.URL}
}

// answered is an answer of the HTTP API: its status, the view of its body
// (a view, or TimedOutBody's), and its error.
type answered struct {
	status int
	view   events.View
	err    *events.Error
}

// post sends a command; key is its Idempotency-Key, token its bearer token
// ("" for none).
func (o *outcomeRig) post(t *testing.T, method, path, key, token, body string) answered {
	t.Helper()
	req, err := http.NewRequest(method, o.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var raw map[string]json.RawMessage
	if err := json.NewDecoder(res.Body).Decode(&raw); err != nil {
		t.Fatalf("%s %s: body: %v", method, path, err)
	}
	a := answered{status: res.StatusCode}
	if e, ok := raw["error"]; ok {
		if err := json.Unmarshal(e, &a.err); err != nil {
			t.Fatal(err)
		}
		if v, ok := raw["view"]; ok {
			if err := json.Unmarshal(v, &a.view); err != nil {
				t.Fatal(err)
			}
		}
		return a
	}
	b, _ := json.Marshal(raw)
	if err := json.Unmarshal(b, &a.view); err != nil {
		t.Fatal(err)
	}
	return a
}

// async is post on a goroutine.
func (o *outcomeRig) async(t *testing.T, method, path, key string) <-chan answered {
	ch := make(chan answered, 1)
	go func() { ch <- o.post(t, method, path, key, "", "") }()
	return ch
}

// inView waits until the KV view holds sandbox id in phase.
func (o *outcomeRig) inView(t *testing.T, id string, phase events.Phase) events.View {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := o.view.Wait(ctx, id, phase, 0)
	if err != nil {
		t.Fatalf("sandbox %s never %s in the view: %v", id, phase, err)
	}
	return v
}

func got(t *testing.T, ch <-chan answered) answered {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer")
	}
	return answered{}
}

// TestCommandWaitsForItsOutcome: a command with ?wait=true answers the view
// once its outcome is in it (the suspend: suspended; the create: ready),
// 200 (201 for create); at its timeout 504 DEADLINE_EXCEEDED with the view
// as it is; a refused command its error at once; a retry with the same
// Idempotency-Key the outcome too, the command in the log once; and
// wait=false, or none, the view as accepted, 202.
func TestCommandWaitsForItsOutcome(t *testing.T) {
	o := newOutcomeRig(t, HTTPGuard{})
	ctx := context.Background()

	t.Run("suspend answers suspended", func(t *testing.T) {
		v := readySandbox(t, o.svc)
		ch := o.async(t, http.MethodPost, "/v1/sandboxes/"+v.ID+"/suspend?wait=true&timeout=20s", "")
		o.inView(t, v.ID, events.PhaseSuspending)
		if err := o.svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Suspended{Generation: 1, RestoreRef: "r1"}); err != nil {
			t.Fatal(err)
		}
		a := got(t, ch)
		if a.status != http.StatusOK || a.view.Phase != events.PhaseSuspended || a.view.ID != v.ID || a.view.Seq <= v.Seq+1 {
			t.Fatalf("suspend?wait=true: %d %+v %v, want 200 suspended above seq %d", a.status, a.view, a.err, v.Seq+1)
		}
	})

	t.Run("create answers ready", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		seq, err := o.store.LastSeq(ctx)
		if err != nil {
			t.Fatal(err)
		}
		views, err := o.view.Watch(wctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		ch := o.async(t, http.MethodPost, "/v1/sandboxes?wait=true", "")
		made := <-views
		if made.Phase != events.PhaseProvisioning {
			t.Fatalf("the view's first change: %+v, want a sandbox provisioning", made)
		}
		if err := o.svc.Record(ctx, events.Envelope{SandboxID: made.ID}, "test", &events.SupervisorAttached{Generation: 1}); err != nil {
			t.Fatal(err)
		}
		a := got(t, ch)
		if a.status != http.StatusCreated || a.view.Phase != events.PhaseReady || a.view.ID != made.ID {
			t.Fatalf("create?wait=true: %d %+v %v, want 201 ready", a.status, a.view, a.err)
		}
	})

	t.Run("a timeout answers the view as it is", func(t *testing.T) {
		v := readySandbox(t, o.svc)
		a := o.post(t, http.MethodPost, "/v1/sandboxes/"+v.ID+"/stop?wait=true&timeout=300ms", "", "", "")
		if a.status != http.StatusGatewayTimeout || a.err == nil || a.err.Code != events.CodeDeadlineExceeded ||
			a.view.ID != v.ID || a.view.Phase != events.PhaseStopping {
			t.Fatalf("stop?wait=true with no outcome: %d %+v %v, want 504 DEADLINE_EXCEEDED with the view stopping", a.status, a.view, a.err)
		}
	})

	t.Run("a refused command answers at once", func(t *testing.T) {
		v := readySandbox(t, o.svc)
		start := time.Now()
		a := o.post(t, http.MethodPost, "/v1/sandboxes/"+v.ID+"/resume?wait=true&timeout=5m", "", "", "")
		if a.status != http.StatusConflict || a.err == nil || a.err.Code != events.CodeFailedPrecondition {
			t.Fatalf("resume?wait=true of a ready sandbox: %d %+v %v, want 409 FAILED_PRECONDITION", a.status, a.view, a.err)
		}
		if took := time.Since(start); took > time.Minute {
			t.Fatalf("the refusal took %s", took)
		}
	})

	t.Run("a retry with the key answers the outcome", func(t *testing.T) {
		v := readySandbox(t, o.svc)
		path := "/v1/sandboxes/" + v.ID + "/suspend?wait=true&timeout=300ms"
		first := o.post(t, http.MethodPost, path, "k-1", "", "")
		if first.status != http.StatusGatewayTimeout || first.view.Phase != events.PhaseSuspending {
			t.Fatalf("first suspend: %d %+v %v, want 504 with the view suspending", first.status, first.view, first.err)
		}
		if err := o.svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Suspended{Generation: 1, RestoreRef: "r1"}); err != nil {
			t.Fatal(err)
		}
		again := o.post(t, http.MethodPost, "/v1/sandboxes/"+v.ID+"/suspend?wait=true&timeout=20s", "k-1", "", "")
		if again.status != http.StatusOK || again.view.Phase != events.PhaseSuspended {
			t.Fatalf("the retry: %d %+v %v, want 200 suspended", again.status, again.view, again.err)
		}
		if n := countTypes(t, o.store, v.ID); n["sandbox.suspend_requested"] != 1 {
			t.Fatalf("log %v, want one suspend_requested", n)
		}
	})

	t.Run("without wait the view as accepted", func(t *testing.T) {
		for _, q := range []string{"", "?wait=false"} {
			v := readySandbox(t, o.svc)
			a := o.post(t, http.MethodPost, "/v1/sandboxes/"+v.ID+"/stop"+q, "", "", "")
			if a.status != http.StatusAccepted || a.view.Phase != events.PhaseStopping {
				t.Fatalf("stop%s: %d %+v %v, want 202 stopping", q, a.status, a.view, a.err)
			}
		}
	})

	t.Run("bad parameters", func(t *testing.T) {
		v := readySandbox(t, o.svc)
		for _, q := range []string{"?wait=maybe", "?wait=true&timeout=11m", "?wait=true&timeout=-1s", "?timeout=5s"} {
			a := o.post(t, http.MethodPost, "/v1/sandboxes/"+v.ID+"/stop"+q, "", "", "")
			if a.status != http.StatusBadRequest || a.err == nil || a.err.Code != events.CodeInvalidArgument {
				t.Fatalf("stop%s: %d %+v %v, want 400 INVALID_ARGUMENT", q, a.status, a.view, a.err)
			}
		}
		if n := countTypes(t, o.store, v.ID); n["sandbox.stop_requested"] != 0 {
			t.Fatalf("log %v: a refused parameter stopped the sandbox", n)
		}
	})
}

// TestCommandWaitWantsTheCommandsScope: ?wait=true changes nothing of who
// may command: no token is UNAUTHENTICATED, a read token PERMISSION_DENIED,
// and neither lands in the log; a write token's command waits.
func TestCommandWaitWantsTheCommandsScope(t *testing.T) {
	o := newOutcomeRig(t, HTTPGuard{Auth: fuzzAuth{}})
	v := readySandbox(t, o.svc)
	path := "/v1/sandboxes/" + v.ID + "/suspend?wait=true&timeout=300ms"
	for _, c := range []struct {
		token string
		want  events.Code
	}{{"", events.CodeUnauthenticated}, {fuzzTokens[1].secret, events.CodePermissionDenied}} {
		a := o.post(t, http.MethodPost, path, "", c.token, "")
		if a.err == nil || a.err.Code != c.want || a.status != c.want.HTTPStatus() {
			t.Fatalf("token %q: %d %+v %v, want %s", c.token, a.status, a.view, a.err, c.want)
		}
		if a := o.post(t, http.MethodPost, "/v1/sandboxes?wait=true&timeout=300ms", "", c.token, ""); a.err == nil || a.err.Code != c.want {
			t.Fatalf("create with token %q: %d %+v %v, want %s", c.token, a.status, a.view, a.err, c.want)
		}
	}
	if n := countTypes(t, o.store, v.ID); n["sandbox.suspend_requested"] != 0 {
		t.Fatalf("log %v: a command without write landed", n)
	}
	a := o.post(t, http.MethodPost, path, "", fuzzTokens[2].secret, "")
	if a.status != http.StatusGatewayTimeout || a.view.Phase != events.PhaseSuspending {
		t.Fatalf("write token: %d %+v %v, want 504 with the view suspending", a.status, a.view, a.err)
	}
}

// TestCommandWaitHoldsAPlaceAmongWaits: a command with ?wait=true takes a
// place among the server's waits before it runs: with every place held it
// is refused RESOURCE_EXHAUSTED, and nothing lands in the log.
func TestCommandWaitHoldsAPlaceAmongWaits(t *testing.T) {
	r := newRig(t)
	svc, h, base := limitsHTTP(t, r, Limits{Waits: 1})
	held, probe := readySandbox(t, svc), readySandbox(t, svc)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sandboxes/"+held.ID+"/wait?phase=stopped&timeout=10m", nil)
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for h.waits.Load() < 1 { // the held wait answers only at its end
		runtime.Gosched()
	}
	if status, eb := do(t, http.MethodPost, base+"/v1/sandboxes/"+probe.ID+"/stop?wait=true", ""); status != http.StatusTooManyRequests || eb.Error == nil || eb.Error.Code != events.CodeResourceExhausted {
		t.Fatalf("stop?wait=true with every wait's place held: %d %+v, want 429 RESOURCE_EXHAUSTED", status, eb.Error)
	}
	if n := countTypes(t, r.store, probe.ID); n["sandbox.stop_requested"] != 0 {
		t.Fatalf("log %v: the refused command landed", n)
	}
	if status, _ := do(t, http.MethodPost, base+"/v1/sandboxes/"+probe.ID+"/stop", ""); status != http.StatusAccepted {
		t.Fatalf("stop without wait: %d, want 202 (it holds no wait's place)", status)
	}
}
