package torpor_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// A change without an idempotency key (the token endpoints) that got no
// answer is sent once: it may have been done, and sent again it would
// answer ALREADY_EXISTS or NOT_FOUND for itself. A read, a keyed command
// and an answered UNAVAILABLE are sent again. The server here cuts every
// connection without an answer (or answers 503), which is what is under
// test: what the SDK does when nothing, or UNAVAILABLE, comes back.
func TestKeylessChangeSentOnce(t *testing.T) {
	var mu sync.Mutex
	sent := map[string]int{}
	cut := func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent[r.Method+" "+r.URL.Path]++
		mu.Unlock()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/tokens", cut)
	mux.HandleFunc("/v1/tokens/{name}", cut)
	mux.HandleFunc("/v1/sandboxes/{id}/suspend", cut)
	mux.HandleFunc("/v1/unavailable/v1/tokens", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent["answered "+r.Method]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"code":"UNAVAILABLE","message":"try again"}}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := torpor.New(srv.URL, nil)
	ctx := ctxFor(t)

	_, err := c.CreateToken(ctx, torpor.TokenRequest{Name: "ci", Scopes: []torpor.Scope{torpor.ScopeRead}})
	if got := torpor.CodeOf(err); got != events.CodeUnavailable {
		t.Errorf("create token with no answer: %v, want UNAVAILABLE", err)
	}
	if err := c.RevokeToken(ctx, "ci"); torpor.CodeOf(err) != events.CodeUnavailable {
		t.Errorf("revoke token with no answer: %v, want UNAVAILABLE", err)
	}
	_, _ = c.Tokens(ctx)
	_, _ = c.Suspend(ctx, "0190b9a0-0000-7000-8000-000000000001") // keyed by the SDK
	_, err = torpor.New(srv.URL+"/v1/unavailable", nil).CreateToken(ctx, torpor.TokenRequest{Name: "ci", Scopes: []torpor.Scope{torpor.ScopeRead}})
	if torpor.CodeOf(err) != events.CodeUnavailable {
		t.Errorf("create token answered UNAVAILABLE: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	for what, want := range map[string]string{
		"POST /v1/tokens":      "once",
		"DELETE /v1/tokens/ci": "once",
		"GET /v1/tokens":       "again",
		"POST /v1/sandboxes/0190b9a0-0000-7000-8000-000000000001/suspend": "again",
		"answered POST": "again",
	} {
		n := sent[what]
		if (want == "once") != (n == 1) || n == 0 {
			t.Errorf("%s: sent %d times, want %s", what, n, want)
		}
	}
}
