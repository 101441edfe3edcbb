package node

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections/kvview"
)

// TestReplayBusy: a rebuild of a view while another of the same view runs
// is refused FAILED_PRECONDITION (409), and taken once the first is done.
func TestReplayBusy(t *testing.T) {
	ctx := context.Background()
	srv := natstest.Start(t)
	store, err := jsstore.New(ctx, srv.JS, jsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	view, err := kvview.New(ctx, srv.JS, kvview.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := NewReplayHandler(ReplayDeps{Store: store, KV: view, Log: zerolog.Nop()})
	post := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/replay", strings.NewReader(`{"view":"kv"}`)))
		return rec
	}
	h.busy["kv"].Lock()
	rec := post()
	h.busy["kv"].Unlock()
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), `"code":"FAILED_PRECONDITION"`) {
		t.Errorf("a second rebuild: %d %s; want 409 FAILED_PRECONDITION", rec.Code, rec.Body.String())
	}
	if rec := post(); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"phase":"done"`) {
		t.Errorf("the rebuild once the first is done: %d %s", rec.Code, rec.Body.String())
	}
}
