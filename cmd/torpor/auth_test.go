package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/access"
	"github.com/torpor/torpor/services/gateway"
)

// call sends a request with exactly the headers hdr (no token of the
// harness's) and answers the status, the contract code of an error body
// ("" for none) and the response.
func call(t *testing.T, method, url, body string, hdr map[string]string) (int, events.Code, http.Header, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := anonymous.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var data []byte
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		cancel() // a watch: its status and headers are the answer
	} else {
		data, _ = io.ReadAll(resp.Body)
	}
	var eb events.ErrorBody
	if json.Unmarshal(data, &eb) == nil && eb.Error != nil {
		return resp.StatusCode, eb.Error.Code, resp.Header, data
	}
	return resp.StatusCode, "", resp.Header, data
}

func bearer(tok string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
}

// byActor counts the events of a's whole log by their actor: a refused
// request's token appears in none (the sagas' own appends, which follow a
// create for a while, are another actor's).
func byActor(t *testing.T, a *app) map[string]int {
	t.Helper()
	n := map[string]int{}
	if _, err := a.Store().Replay(context.Background(), 0, func(envs []events.Envelope) error {
		for _, e := range envs {
			n[e.Actor]++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// sameActors fails t if a refused request appended: the counts of the
// actors that made requests differ from before.
func sameActors(t *testing.T, before, after map[string]int, what string) {
	t.Helper()
	for actor, n := range after {
		if strings.HasPrefix(actor, "token:") || strings.HasPrefix(actor, "http:") {
			if before[actor] != n {
				t.Errorf("%s appended: %d events of %s, %d before", what, n, actor, before[actor])
			}
		}
	}
}

// TestHTTPScopes: every route of the API against no token, a forged one,
// and a token of each scope: no token is UNAUTHENTICATED (with a
// WWW-Authenticate challenge), a token without the route's scope is
// PERMISSION_DENIED, and neither appends anything to the log; a token with
// the scope gets through. The scopes wanted are written out here from the
// README's Security section, not read from the server.
func TestHTTPScopes(t *testing.T) {
	a := startApp(t, "", nil)
	admin := appClient(a)
	ctx := context.Background()
	tokens := map[events.Scope]string{}
	for _, sc := range []events.Scope{events.ScopeRead, events.ScopeWrite, events.ScopeAdmin} {
		tok, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "only-" + string(sc), Scopes: []events.Scope{sc}})
		if err != nil {
			t.Fatal(err)
		}
		tokens[sc] = tok.Token
	}
	v := readySim(t, admin, "target")
	base := "http://" + a.HTTPAddr()
	id := v.ID
	routes := []struct {
		method, path, body string
		need               events.Scope
	}{
		{"GET", "/v1/sandboxes", "", "read"},
		{"GET", "/v1/sandboxes/" + id, "", "read"},
		{"GET", "/v1/sandboxes/target?at=1", "", "read"},
		{"GET", "/v1/sandboxes/" + id + "/events", "", "read"},
		{"GET", "/v1/sandboxes/" + id + "/logs", "", "read"},
		{"GET", "/v1/sandboxes/" + id + "/wait?phase=ready&timeout=1s", "", "read"},
		{"GET", "/v1/watch", "", "read"},
		{"GET", "/v1/phases", "", "read"},
		{"GET", "/v1/drivers", "", "read"},
		{"GET", "/v1/server", "", "read"},
		{"GET", "/v1/whoami", "", "read"},
		{"GET", "/v1/log/sandboxes", "", "read"},
		{"GET", "/metrics", "", "read"},
		{"GET", "/v1/no-such-route", "", "read"},
		{"POST", "/v1/sandboxes", `{"name":"made","driver":"sim"}`, "write"},
		{"POST", "/v1/sandboxes/" + id + "/suspend", "", "write"},
		{"POST", "/v1/sandboxes/" + id + "/resume", "", "write"},
		{"POST", "/v1/sandboxes/" + id + "/stop", "", "write"},
		{"POST", "/v1/sandboxes/" + id + "/start", "", "write"},
		{"POST", "/v1/sandboxes/" + id + "/forwards", `{"port":80}`, "write"},
		{"DELETE", "/v1/sandboxes/" + id + "/forwards/0193b0a4-0000-7000-8000-00000000f00d", "", "write"},
		{"POST", "/v1/sandboxes/" + id + "/touch", "", "write"},
		{"DELETE", "/v1/sandboxes/" + id, "", "write"},
		{"POST", "/v1/replay", `{"view":"kv","until":1}`, "admin"},
		{"POST", "/v1/tokens", `{"name":"more","scopes":["read"]}`, "admin"},
		{"GET", "/v1/tokens", "", "admin"},
		{"DELETE", "/v1/tokens/only-read", "", "admin"},
	}
	holds := map[events.Scope][]events.Scope{"read": {"read"}, "write": {"write"}, "admin": {"read", "write", "admin"}}
	before := byActor(t, a)
	// Refusals first: nothing may change.
	for _, r := range routes {
		for _, who := range []struct {
			name string
			hdr  map[string]string
			want events.Code
		}{
			{"no token", map[string]string{"Content-Type": "application/json"}, events.CodeUnauthenticated},
			{"not a bearer", map[string]string{"Authorization": "Basic YWRtaW46YWRtaW4=", "Content-Type": "application/json"}, events.CodeUnauthenticated},
			{"a forged token", bearer(access.Prefix + "only-admin_" + strings.Repeat("A", 43)), events.CodeUnauthenticated},
			{"read", bearer(tokens["read"]), events.CodePermissionDenied},
			{"write", bearer(tokens["write"]), events.CodePermissionDenied},
			{"admin", bearer(tokens["admin"]), events.CodePermissionDenied},
		} {
			if sc := events.Scope(who.name); who.want == events.CodePermissionDenied && contains(holds[sc], r.need) {
				continue // allowed: below
			}
			status, code, hdr, body := call(t, r.method, base+r.path, r.body, who.hdr)
			if code != who.want || status != who.want.HTTPStatus() {
				t.Errorf("%s %s with %s: %d %s %s, want %s", r.method, r.path, who.name, status, code, body, who.want)
			}
			if who.want == events.CodeUnauthenticated && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s with %s: no WWW-Authenticate: Bearer challenge", r.method, r.path, who.name)
			}
		}
	}
	sameActors(t, before, byActor(t, a), "refused requests")
	if items, err := admin.Tokens(ctx); err != nil || len(items) != 4 {
		t.Fatalf("refused requests changed the tokens: %+v, %v", items, err)
	}
	// Then each route with the narrowest token that holds its scope.
	for _, r := range routes {
		status, code, _, body := call(t, r.method, base+r.path, r.body, bearer(tokens[r.need]))
		if code == events.CodeUnauthenticated || code == events.CodePermissionDenied {
			t.Errorf("%s %s with a %s token: %d %s %s", r.method, r.path, r.need, status, code, body)
		}
	}
	// /healthz and /readyz answer anyone.
	for _, path := range []string{"/healthz", "/readyz"} {
		if status, code, _, body := call(t, "GET", base+path, "", nil); status != http.StatusOK {
			t.Errorf("GET %s without a token: %d %s %s, want 200", path, status, code, body)
		}
	}
}

func contains(s []events.Scope, x events.Scope) bool {
	for _, e := range s {
		if e == x {
			return true
		}
	}
	return false
}

// TestBrowsersRefused: what a web page can make a browser send to a server
// on loopback (attack row 1: a text/plain POST from a foreign origin, no
// preflight) is refused, even with a valid token, and so is a request
// addressed by a name the server does not answer for (DNS rebinding);
// nothing lands in the log. A configured origin gets CORS headers.
func TestBrowsersRefused(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) {
		c.HTTPHosts = []string{"torpor.internal"}
		c.CORSOrigins = []string{"https://ops.example.com"}
	})
	base := "http://" + a.HTTPAddr()
	tok := a.AdminToken()
	create := `{"name":"evil","driver":"process","command":["sh","-c","id > /tmp/pwned"]}`
	before := byActor(t, a)
	for _, c := range []struct {
		name string
		hdr  map[string]string
		want events.Code
	}{
		{"anonymous text/plain from a foreign origin", map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example"}, events.CodePermissionDenied},
		{"anonymous text/plain", map[string]string{"Content-Type": "text/plain"}, events.CodeInvalidArgument},
		{"anonymous JSON", map[string]string{"Content-Type": "application/json"}, events.CodeUnauthenticated},
		{"text/plain with a token", map[string]string{"Content-Type": "text/plain", "Authorization": "Bearer " + tok}, events.CodeInvalidArgument},
		{"form-encoded with a token", map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Authorization": "Bearer " + tok}, events.CodeInvalidArgument},
		{"no content type with a token", map[string]string{"Authorization": "Bearer " + tok}, events.CodeInvalidArgument},
		{"a foreign origin with a token", map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example", "Authorization": "Bearer " + tok}, events.CodePermissionDenied},
		{"a rebinding host with a token", map[string]string{"Content-Type": "application/json", "Host": "evil.example:8080", "Authorization": "Bearer " + tok}, events.CodePermissionDenied},
		{"a rebinding host, anonymous", map[string]string{"Content-Type": "application/json", "Host": "evil.example"}, events.CodePermissionDenied},
	} {
		status, code, _, body := call(t, "POST", base+"/v1/sandboxes", create, c.hdr)
		if code != c.want || status != c.want.HTTPStatus() {
			t.Errorf("%s: %d %s %s, want %s", c.name, status, code, body, c.want)
		}
	}
	sameActors(t, before, byActor(t, a), "refused creates")
	if _, err := os.Stat("/tmp/pwned"); err == nil {
		t.Error("/tmp/pwned exists: a refused create ran its command (or an earlier run left it)")
	}

	// What the server does answer for.
	for _, c := range []struct{ name, host, origin string }{
		{"localhost", "localhost:1234", ""},
		{"an IP address", "127.0.0.1", ""},
		{"an --http-host name", "torpor.internal:8080", ""},
		{"a same-origin page", "torpor.internal", "http://torpor.internal"},
		{"a --cors-origin page", a.HTTPAddr(), "https://ops.example.com"},
	} {
		hdr := map[string]string{"Authorization": "Bearer " + tok, "Host": c.host}
		if c.origin != "" {
			hdr["Origin"] = c.origin
		}
		status, code, h, body := call(t, "GET", base+"/v1/phases", "", hdr)
		if status != http.StatusOK {
			t.Errorf("%s: %d %s %s, want 200", c.name, status, code, body)
		}
		want := "" // same-origin pages need no CORS header
		if c.origin == "https://ops.example.com" {
			want = c.origin
		}
		if got := h.Get("Access-Control-Allow-Origin"); got != want {
			t.Errorf("%s: Access-Control-Allow-Origin %q, want %q", c.name, got, want)
		}
	}
	// A preflight from the configured origin, and none from another.
	status, _, h, _ := call(t, "OPTIONS", base+"/v1/sandboxes", "", map[string]string{"Origin": "https://ops.example.com", "Access-Control-Request-Method": "POST"})
	if status != http.StatusNoContent || !strings.Contains(h.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("preflight from the configured origin: %d %v", status, h)
	}
	status, code, h, _ := call(t, "OPTIONS", base+"/v1/sandboxes", "", map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
	if code != events.CodePermissionDenied || h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from a foreign origin: %d %s %v", status, code, h)
	}
}

// TestActorIsTheToken: a command's actor in the log is its token's name,
// whatever a Torpor-Actor header says; a revoked token is refused at once;
// an expired one too; a forward off loopback wants admin.
func TestActorIsTheToken(t *testing.T) {
	a := startApp(t, "", nil)
	admin := appClient(a)
	ctx := context.Background()
	ci, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "ci", Scopes: []events.Scope{"read", "write"}})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + a.HTTPAddr()
	hdr := bearer(ci.Token)
	hdr["Torpor-Actor"] = "root"
	status, _, _, body := call(t, "POST", base+"/v1/sandboxes", `{"name":"acted","driver":"sim"}`, hdr)
	if status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	var v events.View
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	mustWait(t, admin, v.ID, events.PhaseReady)
	hist, err := admin.History(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) == 0 || hist[0].Type != "sandbox.created" || hist[0].Actor != "token:ci" {
		t.Fatalf("the create's actor: %+v, want token:ci", hist[0])
	}

	// A forward: loopback with write, elsewhere admin only.
	status, code, _, body := call(t, "POST", base+"/v1/sandboxes/"+v.ID+"/forwards", `{"listen":"0.0.0.0:0","port":80}`, bearer(ci.Token))
	if code != events.CodePermissionDenied {
		t.Errorf("a forward on 0.0.0.0 with write: %d %s %s, want PERMISSION_DENIED", status, code, body)
	}
	status, code, _, body = call(t, "POST", base+"/v1/sandboxes/"+v.ID+"/forwards", `{"listen":"0.0.0.0:0","port":80}`, bearer(a.AdminToken()))
	if code == events.CodePermissionDenied || code == events.CodeUnauthenticated {
		t.Errorf("a forward on 0.0.0.0 with admin: %d %s %s", status, code, body)
	}

	if err := admin.RevokeToken(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	if status, code, _, _ := call(t, "GET", base+"/v1/phases", "", bearer(ci.Token)); code != events.CodeUnauthenticated {
		t.Errorf("a revoked token: %d %s, want UNAUTHENTICATED", status, code)
	}

	brief, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "brief", Scopes: []events.Scope{"read"}, Expires: "1s"})
	if err != nil {
		t.Fatal(err)
	}
	if status, _, _, body := call(t, "GET", base+"/v1/phases", "", bearer(brief.Token)); status != http.StatusOK {
		t.Fatalf("a fresh token: %d %s", status, body)
	}
	time.Sleep(time.Until(*brief.ExpiresAt)) // the passing of time is what is tested
	if status, code, _, _ := call(t, "GET", base+"/v1/phases", "", bearer(brief.Token)); code != events.CodeUnauthenticated {
		t.Errorf("an expired token: %d %s, want UNAUTHENTICATED", status, code)
	}
}

// TestNoAuth: --no-auth is refused off loopback; on loopback it serves
// anonymous requests, whose actor is their address.
func TestNoAuth(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:8080", ":8080"} {
		cfg := serveConfig{Data: t.TempDir(), HTTP: addr, NATSListen: "127.0.0.1:0", Fsync: "interval", Node: "local", Deadline: time.Minute, DuplicateWindow: time.Minute, HeartbeatLimit: time.Second, NoAuth: true}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--no-auth") {
			t.Errorf("--no-auth --http %s: %v, want a refusal naming --no-auth", addr, err)
		}
	}
	a := startApp(t, "", func(c *serveConfig) { c.NoAuth = true })
	if a.AdminToken() != "" {
		t.Error("--no-auth minted an admin token")
	}
	base := "http://" + a.HTTPAddr()
	status, _, _, body := call(t, "POST", base+"/v1/sandboxes", `{"name":"open","driver":"sim"}`, map[string]string{"Content-Type": "application/json", "Torpor-Actor": "root"})
	if status != http.StatusCreated {
		t.Fatalf("an anonymous create under --no-auth: %d %s", status, body)
	}
	var v events.View
	_ = json.Unmarshal(body, &v)
	hist, err := torpor.New(a.HTTPAddr(), nil).History(context.Background(), v.ID, 0)
	if err != nil || len(hist) == 0 || hist[0].Actor != "http:127.0.0.1" {
		t.Errorf("actor under --no-auth: %+v, %v; want http:127.0.0.1", hist, err)
	}
}

// TestTheLocalCLIFindsTheAdminToken: serve's first start writes
// <data>/admin.token, mode 0600, and says so; the CLI run in the directory
// above a torpor-data finds it with no flag or variable; a restart keeps the
// same token; torpor token create, list and revoke work with it.
func TestTheLocalCLIFindsTheAdminToken(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "torpor-data")
	c := serveProcess(t, data)
	st, err := os.Stat(filepath.Join(data, access.AdminFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("admin.token: %v, %v; want mode 0600", st, err)
	}
	first := tokenFor(c.http)
	cliIn := func(env []string, args ...string) (int, string, string) {
		t.Helper()
		cmd := exec.Command(binary(t), append([]string{"--server", "http://" + c.http}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(cliEnv(), env...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), out.String(), errb.String()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, out.String(), errb.String()
	}
	if code, out, stderr := cliIn(nil, "create", "local-demo", "-o", "name"); code != 0 || strings.TrimSpace(out) != "local-demo" {
		t.Fatalf("create with the admin token found under ./torpor-data: %d %q %s", code, out, stderr)
	}
	code, out, stderr := cliIn(nil, "token", "create", "viewer", "--scope", "read", "--expires", "30d")
	viewer := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(viewer, access.Prefix+"viewer_") || !strings.Contains(stderr, "shown once") {
		t.Fatalf("token create: %d %q %s", code, out, stderr)
	}
	if code, out, _ := cliIn(nil, "token", "list"); code != 0 || !strings.Contains(out, "viewer") || !strings.Contains(out, "read") || strings.Contains(out, viewer) {
		t.Errorf("token list: %d\n%s", code, out)
	}
	if code, _, stderr := cliIn([]string{"TORPOR_TOKEN=" + viewer}, "delete", "local-demo"); code != 10 || !strings.Contains(stderr, "PERMISSION_DENIED") {
		t.Errorf("delete with a read token: exit %d %s; want 10 PERMISSION_DENIED", code, stderr)
	}
	if code, _, stderr := cliIn([]string{"TORPOR_TOKEN=" + viewer}, "get", "local-demo"); code != 0 {
		t.Errorf("get with a read token: exit %d %s", code, stderr)
	}
	if code, _, stderr := cliIn(nil, "--token", "torpor_nobody_"+strings.Repeat("x", 43), "get", "local-demo"); code != 10 || !strings.Contains(stderr, "UNAUTHENTICATED") {
		t.Errorf("get with a forged --token: exit %d %s; want 10 UNAUTHENTICATED", code, stderr)
	}
	if code, _, stderr := cliIn(nil, "token", "revoke", "viewer"); code != 0 {
		t.Errorf("token revoke: %d %s", code, stderr)
	}
	if code, _, stderr := cliIn([]string{"TORPOR_TOKEN=" + viewer}, "get", "local-demo"); code != 10 || !strings.Contains(stderr, "UNAUTHENTICATED") {
		t.Errorf("get with the revoked token: exit %d %s", code, stderr)
	}
	if code, _, stderr := cliIn(nil, "token", "create", "x", "--scope", "root"); code != 2 || !strings.Contains(stderr, "INVALID_ARGUMENT") {
		t.Errorf("token create with an unknown scope: exit %d %s; want 2", code, stderr)
	}

	c.kill()
	c = serveProcess(t, data)
	if tokenFor(c.http) != first {
		t.Error("a restart on the same --data changed the admin token")
	}
	if code, _, stderr := cliIn(nil, "get", "local-demo"); code != 0 {
		t.Errorf("get after the restart: %d %s", code, stderr)
	}
}

// TestTokenRateLimit: a token past its rate is RESOURCE_EXHAUSTED at once
// and another token is not slowed by it.
func TestTokenRateLimit(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) {
		c.TokenLimits = gateway.TokenLimits{Rate: 1, Burst: 5}
	})
	base := "http://" + a.HTTPAddr()
	ctx := context.Background()
	admin := appClient(a)
	other, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "other", Scopes: []events.Scope{"read"}})
	if err != nil {
		t.Fatal(err)
	}
	// The admin token spent one request of its burst on the token above.
	refused := 0
	for range 10 {
		if _, code, _, _ := call(t, "GET", base+"/v1/phases", "", bearer(a.AdminToken())); code == events.CodeResourceExhausted {
			refused++
		}
	}
	if refused < 5 {
		t.Errorf("%d of 10 requests past a burst of 5 at 1/s refused; want at least 5", refused)
	}
	if status, code, _, body := call(t, "GET", base+"/v1/phases", "", bearer(other.Token)); status != http.StatusOK {
		t.Errorf("another token while the first is limited: %d %s %s", status, code, body)
	}

}

// TestTokenStreamLimits: a token holding its most watches or waits is
// refused one more at once, and may open one again once one ends.
func TestTokenStreamLimits(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) {
		c.TokenLimits = gateway.TokenLimits{Watches: 2, Waits: 1}
	})
	base := "http://" + a.HTTPAddr()
	ctx := context.Background()
	streams, err := appClient(a).CreateToken(ctx, torpor.TokenRequest{Name: "streams", Scopes: []events.Scope{"admin"}})
	if err != nil {
		t.Fatal(err)
	}
	c := torpor.New(a.HTTPAddr(), nil).WithToken(streams.Token)
	v, err := c.Create(ctx, torpor.CreateRequest{Name: "waited", Driver: "sim"}, "")
	if err != nil {
		t.Fatal(err)
	}
	openWatch := func() (*http.Response, events.Code) {
		t.Helper()
		wctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(wctx, "GET", base+"/v1/watch", nil)
		req.Header.Set("Authorization", "Bearer "+streams.Token)
		resp, err := anonymous.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			return resp, ""
		}
		defer resp.Body.Close()
		var eb events.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		if eb.Error == nil {
			t.Fatalf("watch: %s without a contract error", resp.Status)
		}
		return nil, eb.Error.Code
	}
	w1, _ := openWatch()
	w2, _ := openWatch()
	if w1 == nil || w2 == nil {
		t.Fatal("the first two watches were refused")
	}
	start := time.Now()
	if _, code := openWatch(); code != events.CodeResourceExhausted {
		t.Errorf("a third watch: %s, want RESOURCE_EXHAUSTED", code)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the refusal took %s; want it at once", d)
	}
	w1.Body.Close()
	eventually(t, "a watch again once one ended", func() bool {
		w, _ := openWatch()
		if w != nil {
			w.Body.Close()
		}
		return w != nil
	})
	w2.Body.Close()

	// One wait held open (for a phase the sandbox will not reach), a
	// second refused. The sandbox is ready first, so that the probes (waits
	// for ready) answer at once and never hold the place themselves; the
	// held wait lasts long enough for a busy host to probe within it.
	if _, err := c.Wait(ctx, v.ID, events.PhaseReady, waitFor); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() {
		for {
			// A probe in flight when the held wait arrives refuses it:
			// it asks again until it holds the place.
			_, err := c.Wait(ctx, v.ID, events.PhaseStopped, 8*time.Second)
			if events.CodeOf(err) != events.CodeResourceExhausted {
				held <- err
				return
			}
		}
	}()
	eventually(t, "a second wait refused while one is held", func() bool {
		_, code, _, _ := call(t, "GET", base+"/v1/sandboxes/"+v.ID+"/wait?phase=ready&timeout=1s", "", bearer(streams.Token))
		return code == events.CodeResourceExhausted
	})
	if err := <-held; events.CodeOf(err) != events.CodeDeadlineExceeded {
		t.Errorf("the held wait: %v, want DEADLINE_EXCEEDED", err)
	}
	// The held wait ends on the server a moment after its client gave up
	// (the server's timeout starts when the request arrives): its place is
	// free again then.
	eventually(t, "a wait once the held one ended", func() bool {
		status, _, _, _ := call(t, "GET", base+"/v1/sandboxes/"+v.ID+"/wait?phase=ready&timeout=5s", "", bearer(streams.Token))
		return status == http.StatusOK
	})
}

// TestTokenSandboxQuota: a token that holds its quota of sandboxes is
// refused a create (RESOURCE_EXHAUSTED, nothing appended) while another
// token is not; a delete frees a place, over HTTP at once, over the bus
// (no token to count against) once the sandbox is deleted.
func TestTokenSandboxQuota(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) { c.TokenLimits = gateway.TokenLimits{Sandboxes: 2} })
	ctx := context.Background()
	admin := appClient(a)
	tok, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "q", Scopes: []events.Scope{"read", "write"}})
	if err != nil {
		t.Fatal(err)
	}
	c := torpor.New(a.HTTPAddr(), nil).WithToken(tok.Token)
	var ids []string
	for _, name := range []string{"q1", "q2"} {
		v, err := c.Create(ctx, torpor.CreateRequest{Name: name, Driver: "sim"}, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.ID)
	}
	before := byActor(t, a)
	if _, err := c.Create(ctx, torpor.CreateRequest{Name: "q3", Driver: "sim"}, ""); events.CodeOf(err) != events.CodeResourceExhausted {
		t.Fatalf("a create past the quota: %v, want RESOURCE_EXHAUSTED", err)
	}
	sameActors(t, before, byActor(t, a), "the refused create")
	if _, err := admin.Create(ctx, torpor.CreateRequest{Name: "other", Driver: "sim"}, ""); err != nil {
		t.Errorf("another token's create: %v", err)
	}
	if _, err := c.Delete(ctx, ids[0], ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, torpor.CreateRequest{Name: "q3", Driver: "sim"}, ""); err != nil {
		t.Fatalf("a create after a delete over HTTP: %v", err)
	}
	// At the quota again; a delete over the bus frees a place once done.
	if _, err := c.Create(ctx, torpor.CreateRequest{Name: "q4", Driver: "sim"}, ""); events.CodeOf(err) != events.CodeResourceExhausted {
		t.Fatalf("a create past the quota again: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, e := busCmd(t, busConn(t, a), "delete", map[string]string{"id": ids[1]}, nil); e != nil {
		t.Fatal(e)
	}
	mustWait(t, admin, ids[1], events.PhaseDeleted)
	if _, err := c.Create(ctx, torpor.CreateRequest{Name: "q4", Driver: "sim"}, ""); err != nil {
		t.Errorf("a create once a sandbox was deleted over the bus: %v", err)
	}
}

// TestTokenBadInputOverHTTP says what each kind of bad input to POST
// /v1/tokens and DELETE /v1/tokens/{name} gets, with its contract code and
// status (CONTRACT §2), and that none of them made or removed a token.
func TestTokenBadInputOverHTTP(t *testing.T) {
	a := startApp(t, "", nil)
	admin := appClient(a)
	ctx := context.Background()
	if _, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "taken", Scopes: []events.Scope{events.ScopeRead}}); err != nil {
		t.Fatal(err)
	}
	writer, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "writer", Scopes: []events.Scope{events.ScopeWrite, events.ScopeRead}})
	if err != nil {
		t.Fatal(err)
	}
	before, err := admin.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + a.HTTPAddr()
	huge := `{"name":"big","scopes":["read"],"expires":"` + strings.Repeat("1", 300<<10) + `h"}`
	adminTok := bearer(a.AdminToken())
	cases := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		code                     events.Code
	}{
		{"malformed JSON", "POST", "/v1/tokens", `{"name":`, adminTok, 400, events.CodeInvalidArgument},
		{"not an object", "POST", "/v1/tokens", `["read"]`, adminTok, 400, events.CodeInvalidArgument},
		{"unknown field", "POST", "/v1/tokens", `{"name":"t1","scopes":["read"],"owner":"me"}`, adminTok, 400, events.CodeInvalidArgument},
		{"no body", "POST", "/v1/tokens", ``, adminTok, 400, events.CodeInvalidArgument},
		{"unknown scope", "POST", "/v1/tokens", `{"name":"t2","scopes":["root"]}`, adminTok, 400, events.CodeInvalidArgument},
		{"empty scopes", "POST", "/v1/tokens", `{"name":"t3","scopes":[]}`, adminTok, 400, events.CodeInvalidArgument},
		{"no scopes", "POST", "/v1/tokens", `{"name":"t4"}`, adminTok, 400, events.CodeInvalidArgument},
		{"empty name", "POST", "/v1/tokens", `{"name":"","scopes":["read"]}`, adminTok, 400, events.CodeInvalidArgument},
		{"name too long", "POST", "/v1/tokens", `{"name":"` + strings.Repeat("a", 64) + `","scopes":["read"]}`, adminTok, 400, events.CodeInvalidArgument},
		{"name with a space", "POST", "/v1/tokens", `{"name":"my token","scopes":["read"]}`, adminTok, 400, events.CodeInvalidArgument},
		{"name starting with a dot", "POST", "/v1/tokens", `{"name":".hidden","scopes":["read"]}`, adminTok, 400, events.CodeInvalidArgument},
		{"name with two dots", "POST", "/v1/tokens", `{"name":"a..b","scopes":["read"]}`, adminTok, 400, events.CodeInvalidArgument},
		{"name with a subject wildcard", "POST", "/v1/tokens", `{"name":"a.*","scopes":["read"]}`, adminTok, 400, events.CodeInvalidArgument},
		{"name in capitals", "POST", "/v1/tokens", `{"name":"Admin","scopes":["read"]}`, adminTok, 400, events.CodeInvalidArgument},
		{"negative expiry", "POST", "/v1/tokens", `{"name":"t5","scopes":["read"],"expires":"-1h"}`, adminTok, 400, events.CodeInvalidArgument},
		{"expiry forever", "POST", "/v1/tokens", `{"name":"t6","scopes":["read"],"expires":"forever"}`, adminTok, 400, events.CodeInvalidArgument},
		{"expiry a past time", "POST", "/v1/tokens", `{"name":"t7","scopes":["read"],"expires":"2020-01-01T00:00:00Z"}`, adminTok, 400, events.CodeInvalidArgument},
		{"zero expiry", "POST", "/v1/tokens", `{"name":"t8","scopes":["read"],"expires":"0s"}`, adminTok, 400, events.CodeInvalidArgument},
		{"oversized body", "POST", "/v1/tokens", huge, adminTok, 400, events.CodeInvalidArgument},
		{"duplicate name", "POST", "/v1/tokens", `{"name":"taken","scopes":["write"]}`, adminTok, 409, events.CodeAlreadyExists},
		{"a write token making a token", "POST", "/v1/tokens", `{"name":"t9","scopes":["admin"]}`, bearer(writer.Token), 403, events.CodePermissionDenied},
		{"revoke an unknown name", "DELETE", "/v1/tokens/nobody", ``, adminTok, 404, events.CodeNotFound},
		{"revoke a bad name", "DELETE", "/v1/tokens/Bad%20Name", ``, adminTok, 400, events.CodeInvalidArgument},
		{"revoke a name with two dots", "DELETE", "/v1/tokens/a..b", ``, adminTok, 400, events.CodeInvalidArgument},
		{"revoke a name with a wildcard", "DELETE", "/v1/tokens/a.%3E", ``, adminTok, 400, events.CodeInvalidArgument},
		{"revoke no name", "DELETE", "/v1/tokens/", ``, adminTok, 404, events.CodeNotFound},
		{"a write token revoking a token", "DELETE", "/v1/tokens/taken", ``, bearer(writer.Token), 403, events.CodePermissionDenied},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, code, _, body := call(t, tc.method, base+tc.path, tc.body, tc.hdr)
			var eb events.ErrorBody
			if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil || eb.Error.Message == "" {
				t.Fatalf("status %d body %q: not a contract error", status, body)
			}
			if status != tc.status || code != tc.code {
				t.Fatalf("got %d %s %q, want %d %s", status, code, eb.Error.Message, tc.status, tc.code)
			}
		})
	}
	after, err := admin.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("bad input changed the tokens: %d before, %d after: %+v", len(before), len(after), after)
	}
	for i := range after {
		if after[i].Name != before[i].Name || !after[i].CreatedAt.Equal(before[i].CreatedAt) {
			t.Fatalf("bad input changed token %s: %+v, was %+v", before[i].Name, after[i], before[i])
		}
	}
	// The service still makes and revokes tokens.
	if _, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "after.bad-input", Scopes: []events.Scope{events.ScopeRead}}); err != nil {
		t.Fatalf("a good token after the bad input: %v", err)
	}
	if err := admin.RevokeToken(ctx, "after.bad-input"); err != nil {
		t.Fatalf("revoke after the bad input: %v", err)
	}
}
