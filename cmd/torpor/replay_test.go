package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections"
	"github.com/torpor/torpor/projections/kvview"
	"github.com/torpor/torpor/services/node"
)

// replayServer is a replay endpoint over a log of n sandboxes (created,
// then started) whose KV view is projected live, without a SQL view.
func replayServer(t *testing.T, n int) (*httptest.Server, http.Handler, uint64) {
	t.Helper()
	ctx := context.Background()
	srv := natstest.Start(t)
	store, err := jsstore.New(ctx, srv.JS, jsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range n {
		id := uuid.Must(uuid.NewV7()).String()
		var prev uint64
		for j, e := range []events.Event{
			&events.Created{Name: fmt.Sprint("box-", i), Driver: "sim", Node: "n1", Generation: 1},
			&events.Started{Generation: 1, CredentialHash: "h"},
		} {
			env, err := events.NewEnvelope(id, e, events.Meta{Actor: "test", CommandID: fmt.Sprint("c", i, "-", j)}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			env.Phase = []events.Phase{events.PhaseProvisioning, events.PhaseReady}[j]
			if prev, err = store.Append(ctx, id, prev, env); err != nil {
				t.Fatal(err)
			}
			last = prev
		}
	}
	view, err := kvview.New(ctx, srv.JS, kvview.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := projections.NewRunner(store, view, projections.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for r.Position() < last {
		time.Sleep(5 * time.Millisecond)
	}
	deps := node.ReplayDeps{Store: store, KV: view, Log: zerolog.Nop()}
	h := node.NewReplayHandler(deps)
	// The server's handler is one of its own (a second rebuild while one
	// runs is services/node's TestReplayBusy).
	mux := http.NewServeMux()
	mux.Handle("POST /v1/replay", node.NewReplayHandler(deps))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs, h, last
}

// TestReplayVerb: torpor replay, its output not a terminal, prints a plain
// line per progress report and a last line saying where the rebuilt view
// is (swapped in, or beside the live one for --until), and exits 0.
func TestReplayVerb(t *testing.T) {
	hs, _, last := replayServer(t, 1500)

	code, out, errOut := cli(t, hs.URL, "replay", "--view", "kv")
	if code != 0 {
		t.Fatalf("replay --view kv: exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "replay kv: fold ") {
		t.Errorf("output %q: want progress lines first", out)
	}
	for _, l := range lines[:len(lines)-1] {
		if !strings.HasPrefix(l, "replay kv: ") || !strings.Contains(l, "/") {
			t.Errorf("progress line %q: want \"replay kv: PHASE DONE/TOTAL\"", l)
		}
		if strings.ContainsAny(l, "\r\x1b") {
			t.Errorf("progress line %q holds terminal control characters", l)
		}
	}
	if want := fmt.Sprintf("replay kv: done at seq %d: swapped in as torpor_phases", last); !strings.HasPrefix(lines[len(lines)-1], want) {
		t.Errorf("last line %q, want %q…", lines[len(lines)-1], want)
	}

	code, out, errOut = cli(t, hs.URL, "replay", "--view", "kv", "--until", "100")
	if code != 0 || !strings.Contains(out, "replay kv: done at seq 100: built beside the live view as torpor_phases_at_100") {
		t.Errorf("replay --until 100: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestReplayRefused: what cannot be replayed exits non-zero with the
// contract's code: an unknown view and an until that does not parse
// (INVALID_ARGUMENT, also from the server), sql on a server without a SQL
// view and a second rebuild of a view (FAILED_PRECONDITION), an until past
// the log (INVALID_ARGUMENT), the same past twice (ALREADY_EXISTS).
func TestReplayRefused(t *testing.T) {
	hs, h, last := replayServer(t, 20)
	for _, c := range []struct {
		args []string
		code events.Code
	}{
		{[]string{"replay", "--view", "bogus"}, events.CodeInvalidArgument},
		{[]string{"replay"}, events.CodeInvalidArgument},
		{[]string{"replay", "--view", "kv", "--until", "yesterday"}, events.CodeInvalidArgument},
		{[]string{"replay", "--view", "sql"}, events.CodeFailedPrecondition},
		{[]string{"replay", "--view", "kv", "--until", fmt.Sprint(last + 1)}, events.CodeInvalidArgument},
	} {
		code, out, errOut := cli(t, hs.URL, c.args...)
		if code == 0 || !strings.HasPrefix(errOut, "torpor: "+string(c.code)+": ") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want non-zero and %s", c.args, code, out, errOut, c.code)
		}
	}
	if code, _, errOut := cli(t, hs.URL, "replay", "--view", "kv", "--until", "5"); code != 0 {
		t.Fatalf("replay --until 5: exit %d, %s", code, errOut)
	}
	if code, _, errOut := cli(t, hs.URL, "replay", "--view", "kv", "--until", "5"); code == 0 || !strings.Contains(errOut, "ALREADY_EXISTS") {
		t.Errorf("replay --until 5 again: exit %d, stderr %q; want ALREADY_EXISTS", code, errOut)
	}

	// The server refuses on its own what the client does not check.
	for _, c := range []struct {
		body   string
		status int
		code   events.Code
	}{
		{`{"view":"bogus"}`, 400, events.CodeInvalidArgument},
		{`{"view":"kv","until":"soon"}`, 400, events.CodeInvalidArgument},
		{`{"view":"kv","extra":1}`, 400, events.CodeInvalidArgument},
		{`{"view":"sql"}`, 409, events.CodeFailedPrecondition},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/replay", strings.NewReader(c.body)))
		if rec.Code != c.status || !strings.Contains(rec.Body.String(), `"code":"`+string(c.code)+`"`) {
			t.Errorf("POST %s: %d %s; want %d %s", c.body, rec.Code, rec.Body.String(), c.status, c.code)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/replay", bytes.NewReader([]byte(`{"view":"kv","until":7}`))))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"phase":"done"`) || !strings.Contains(rec.Body.String(), `"target":"torpor_phases_at_7"`) {
		t.Errorf("POST until 7: %d %s", rec.Code, rec.Body.String())
	}
}
