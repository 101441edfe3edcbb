package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/web"
)

// dashboardHTTP is the HTTP API as serve builds it, with the dashboard,
// over a fuzzRig's service, authenticating fuzzTokens.
func dashboardHTTP(r fuzzRig) *HTTP {
	return NewHTTP(r.svc, logViews{r.svc}, nil, zerolog.Nop()).WithGuard(HTTPGuard{Auth: fuzzAuth{}}).WithDashboard(web.Handler())
}

// askUI sends method path with the token secret (none if empty) to h.
func askUI(t *testing.T, h http.Handler, method, path, secret string) *http.Response {
	t.Helper()
	req := httptest.NewRequestWithContext(fuzzCtx(t), method, "http://127.0.0.1:8080"+path, nil)
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

// errorCode is the contract code of an error answer's body.
func errorCode(t *testing.T, res *http.Response) events.Code {
	t.Helper()
	var eb events.ErrorBody
	if err := json.NewDecoder(res.Body).Decode(&eb); err != nil || eb.Error == nil {
		t.Fatalf("status %d: not the contract's error body (%v)", res.StatusCode, err)
	}
	return eb.Error.Code
}

// TestDashboardServedWithoutToken: the dashboard's page and assets answer
// anyone (they hold no data) with the security headers: a policy that
// loads nothing from elsewhere and runs no inline script, no sniffing, no
// framing. Every other route the API lacks is still UNAUTHENTICATED to an
// outsider and NOT_FOUND to a reader.
func TestDashboardServedWithoutToken(t *testing.T) {
	h := dashboardHTTP(newFuzzRig(t))
	inlineScript := regexp.MustCompile(`(?is)<script(?:\s[^>]*)?>\s*[^<\s]`)
	for _, c := range []struct{ path, contentType string }{
		{"/", "text/html"},
		{"/ui/app.js", "text/javascript"},
		{"/ui/style.css", "text/css"},
	} {
		res := askUI(t, h, "GET", c.path, "")
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s without a token: %d %s, want 200", c.path, res.StatusCode, body)
			continue
		}
		if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, c.contentType) {
			t.Errorf("GET %s: Content-Type %q, want %s", c.path, ct, c.contentType)
		}
		csp := res.Header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %s", c.path, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("GET %s: Content-Security-Policy %q allows inline or eval'd script", c.path, csp)
		}
		if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("GET %s: X-Content-Type-Options %q, want nosniff", c.path, got)
		}
		if c.path == "/" && inlineScript.Match(body) {
			t.Errorf("GET /: the page has an inline script")
		}
	}
	for _, c := range []struct {
		method, path, secret string
		want                 events.Code
	}{
		{"GET", "/nope", "", events.CodeUnauthenticated},
		{"GET", "/v1/nope", "", events.CodeUnauthenticated},
		{"POST", "/", "", events.CodeUnauthenticated},
		{"DELETE", "/ui/app.js", "", events.CodeUnauthenticated},
		{"GET", "/index.html", "", events.CodeUnauthenticated},
		{"GET", "/nope", fuzzTokens[1].secret, events.CodeNotFound},
		{"POST", "/", fuzzTokens[1].secret, events.CodeNotFound},
		{"GET", "/ui/nope.js", "", events.CodeNotFound}, // the assets' own route: no data there
	} {
		res := askUI(t, h, c.method, c.path, c.secret)
		if got := errorCode(t, res); got != c.want || res.StatusCode != c.want.HTTPStatus() {
			t.Errorf("%s %s with token %q: %d %s, want %s", c.method, c.path, c.secret, res.StatusCode, got, c.want)
		}
	}
}

// TestWhoami: a token learns its own name and scopes (the dashboard shows
// action buttons to write only); an outsider learns nothing.
func TestWhoami(t *testing.T) {
	h := dashboardHTTP(newFuzzRig(t))
	if res := askUI(t, h, "GET", "/v1/whoami", ""); errorCode(t, res) != events.CodeUnauthenticated {
		t.Errorf("GET /v1/whoami without a token: %d, want UNAUTHENTICATED", res.StatusCode)
	}
	if res := askUI(t, h, "GET", "/v1/whoami", fuzzTokens[4].secret); errorCode(t, res) != events.CodeUnauthenticated {
		t.Errorf("GET /v1/whoami with a forged token: %d, want UNAUTHENTICATED", res.StatusCode)
	}
	for _, c := range []struct {
		tok  int
		want Whoami
	}{
		{1, Whoami{Name: "r", Scopes: []events.Scope{events.ScopeRead}}},
		{3, Whoami{Name: "a", Scopes: []events.Scope{events.ScopeAdmin}}},
	} {
		res := askUI(t, h, "GET", "/v1/whoami", fuzzTokens[c.tok].secret)
		var got Whoami
		if err := json.NewDecoder(res.Body).Decode(&got); err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/whoami as %s: %d, %v", c.want.Name, res.StatusCode, err)
		}
		if got.Name != c.want.Name || len(got.Scopes) != len(c.want.Scopes) || got.Scopes[0] != c.want.Scopes[0] {
			t.Errorf("GET /v1/whoami as %s: %+v, want %+v", c.want.Name, got, c.want)
		}
	}
}

// TestLogHeadHeader: the list and the counts name the log's last sequence
// less the lag of the view furthest behind, so that a watch started there
// misses no change the answer lacked and skips the current view of every
// sandbox.
func TestLogHeadHeader(t *testing.T) {
	r := newFuzzRig(t)
	h := dashboardHTTP(r)
	ctx := context.Background()
	ids := []string{r.id}
	for i := range 2 {
		if i > 0 {
			v, err := r.svc.Handle(ctx, Command{Verb: VerbCreate, Actor: "test", Create: events.CreateRequest{Name: "db", Driver: "sim"}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, v.ID)
		}
		// The log holds the events of these sandboxes and nothing else.
		want := 0
		for _, id := range ids {
			envs, err := r.svc.History(ctx, id, 0)
			if err != nil {
				t.Fatal(err)
			}
			want += len(envs)
		}
		for _, path := range []string{"/v1/sandboxes", "/v1/phases"} {
			res := askUI(t, h, "GET", path, fuzzTokens[1].secret)
			got, err := strconv.Atoi(res.Header.Get(HeaderLogHead))
			if res.StatusCode != http.StatusOK || err != nil || got != want {
				t.Errorf("GET %s after %d sandboxes: %d, %s %q, want %d", path, i+1, res.StatusCode, HeaderLogHead, res.Header.Get(HeaderLogHead), want)
			}
			// Both views 1 event behind: the head less 1, what both hold.
			lagging := dashboardHTTP(r).WithLags(func(context.Context) map[string]uint64 { return map[string]uint64{"kv": 1, "sql": 1} })
			res = askUI(t, lagging, "GET", path, fuzzTokens[1].secret)
			if got, err := strconv.Atoi(res.Header.Get(HeaderLogHead)); err != nil || got != want-1 {
				t.Errorf("GET %s after %d sandboxes, views 1 behind: %s %q, want %d", path, i+1, HeaderLogHead, res.Header.Get(HeaderLogHead), want-1)
			}
		}
	}
}
