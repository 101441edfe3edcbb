package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/memstore"
	"github.com/torpor/torpor/services/compute"
)

// The fuzz targets of the gateway (go test -fuzz, README "Two commands";
// .ci/run runs each for a few seconds). Each input runs against a service
// of its own on the in-memory store, with one sandbox created first
// (fuzzRig), so that what an input does depends on the input alone.

// memNames keeps name reservations and create keys in memory.
type memNames struct {
	mu    sync.Mutex
	names map[string]Holder
	keys  map[string]string
}

var _ Names = (*memNames)(nil)

func newMemNames() *memNames {
	return &memNames{names: map[string]Holder{}, keys: map[string]string{}}
}

func (n *memNames) Reserve(_ context.Context, name, id string) (Holder, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := n.names[name]; ok && h.ID != id {
		return h, fmt.Errorf("%s: %w", name, ErrNameTaken)
	}
	n.names[name] = Holder{ID: id, Since: time.Now()}
	return Holder{}, nil
}

func (n *memNames) Take(_ context.Context, name, holder, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := n.names[name]; ok && h.ID != holder {
		return fmt.Errorf("%s: %w", name, ErrNameTaken)
	}
	n.names[name] = Holder{ID: id, Since: time.Now()}
	return nil
}

func (n *memNames) Release(_ context.Context, name, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.names[name].ID == id {
		delete(n.names, name)
	}
	return nil
}

func (n *memNames) Lookup(_ context.Context, name string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := n.names[name]; ok {
		return h.ID, nil
	}
	return "", fmt.Errorf("name %s: %w", name, events.ErrNotFound)
}

func (n *memNames) Claim(_ context.Context, key, id string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if got, ok := n.keys[key]; ok {
		return got, nil
	}
	n.keys[key] = id
	return id, nil
}

// logViews answers the reads of the HTTP API from the service's own folds
// of the log: the view of a sandbox at once, a wait that answers at once
// (its phase, or FAILED_PRECONDITION), a watch that ends at once.
type logViews struct{ svc *Service }

func (v logViews) Get(ctx context.Context, id string) (events.View, error) {
	sb, err := v.svc.Sandbox(ctx, id)
	if err != nil {
		return events.View{}, err
	}
	return sb.View, nil
}

func (v logViews) List(context.Context, ListQuery) (events.Page, error) { return events.Page{}, nil }

func (v logViews) Wait(ctx context.Context, id string, phase events.Phase, _ uint64) (events.View, error) {
	got, err := v.Get(ctx, id)
	if err == nil && got.Phase != phase {
		err = events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s", id, got.Phase)
	}
	return got, err
}

func (v logViews) Settle(ctx context.Context, id string, _ uint64) (events.View, error) {
	return v.Get(ctx, id)
}

func (v logViews) Counts(context.Context) (map[events.Phase]int, error) {
	return map[events.Phase]int{}, nil
}

func (v logViews) Watch(context.Context, uint64) (<-chan events.View, error) {
	ch := make(chan events.View)
	close(ch)
	return ch, nil
}

// fuzzRig is a service on a fresh in-memory store with the fake drivers,
// real credentials and sandbox id created (named "web").
type fuzzRig struct {
	svc   *Service
	creds *compute.Credentials
	id    string
}

// fuzzBase is the service whose parts every fuzzRig shares: the
// credentials, the config and the locks (4096 channels, most of the cost
// of a NewService; every call releases what it takes).
var fuzzBase = sync.OnceValues(func() (*Service, error) {
	creds, err := compute.NewCredentials([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		return nil, err
	}
	return NewService(memstore.New(), newMemNames(), fakeDrivers{}, creds, Config{}, zerolog.Nop())
})

func newFuzzRig(t *testing.T) fuzzRig {
	t.Helper()
	base, err := fuzzBase()
	if err != nil {
		t.Fatal(err)
	}
	svc := &Service{store: memstore.New(), names: newMemNames(), drivers: base.drivers, creds: base.creds,
		cfg: base.cfg, log: base.log, now: base.now, locks: base.locks, cache: map[string]*Sandbox{}}
	v, err := svc.Handle(context.Background(), Command{Verb: VerbCreate, Actor: "fuzz", Create: events.CreateRequest{Name: "web", Driver: "sim"}})
	if err != nil {
		t.Fatal(err)
	}
	return fuzzRig{svc: svc, creds: base.creds, id: v.ID}
}

// appended is how many events the rig's log holds.
func (r fuzzRig) appended(t *testing.T) uint64 {
	t.Helper()
	n, err := r.svc.store.(*memstore.Store).LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fuzzCtx bounds every call of an input: none may wait.
func fuzzCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// contractError fails t unless err is a contract error other than INTERNAL
// (a client's input is never the server's fault).
func contractError(t *testing.T, what string, err error) {
	t.Helper()
	var ce *events.Error
	if !errors.As(err, &ce) {
		t.Fatalf("%s: %v (%T) carries no contract code", what, err, err)
	}
	if ce.Code.HTTPStatus() == http.StatusInternalServerError {
		t.Fatalf("%s: %v: code %s for a client's input", what, err, ce.Code)
	}
}

// busVerbs are the verbs of torpor.cmd.<verb>, as the fuzzer picks them.
var busVerbs = Verbs

// FuzzBusCommand: a request on torpor.cmd.<verb> with any body is decoded
// into a command or refused with INVALID_ARGUMENT, never a panic; a command
// decoded is handled with an answer or a contract error, never INTERNAL.
// "@id" in the body stands for the rig's sandbox.
func FuzzBusCommand(f *testing.F) {
	for _, s := range []struct {
		verb uint8
		body string
	}{
		{0, `{"name":"db","driver":"sim","labels":{"team":"a"},"env":{"A":"1"},"command":["sleep","1"]}`},
		{0, `{"name":"web"}`},
		{0, `{"driver":"nope"}`},
		{0, `{"name":"UPPER","driver":"sim"}`},
		{0, `{"name":"a","unknown":1}`},
		{0, ``},
		{0, `null`},
		{0, `[]`},
		{0, `{"labels":{"":""}}`},
		{1, `{"id":"@id"}`},
		{2, `{"id":"@id"}`},
		{3, `{"id":"@id"}`},
		{4, `{"id":"@id","restart_if_restore_fails":true,"node":"other"}`},
		{5, `{"id":"@id"}`},
		{1, `{"id":"not-a-uuid"}`},
		{2, `{"id":"0193b0a4-0000-7000-8000-000000000001"}`},
		{3, `{"id":"@id","node":"x"}`},
		{1, `{}`},
		{1, `{"id":"@id"} {"id":"@id"}`},
		{1, "{\"id\":\"\x00\"}"},
		{4, `{"id":1}`},
	} {
		f.Add(s.verb, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, verb uint8, body []byte) {
		r := newFuzzRig(t)
		v := busVerbs[int(verb)%len(busVerbs)]
		body = bytes.ReplaceAll(body, []byte("@id"), []byte(r.id))
		c, err := decodeCommand(v, body, r.svc.cfg.MaxBody)
		if err != nil {
			if got := events.CodeOf(err); got != events.CodeInvalidArgument {
				t.Fatalf("decode %s %q: %v: code %s, want INVALID_ARGUMENT", v, body, err, got)
			}
			return
		}
		if c.Verb != v || (v != VerbCreate && c.ID == "") {
			t.Fatalf("decode %s %q: %+v", v, body, c)
		}
		c.Actor = "fuzz"
		if _, err := r.svc.Handle(fuzzCtx(t), c); err != nil {
			contractError(t, fmt.Sprintf("%s %q", v, body), err)
		}
	})
}

// httpMethods are the methods the fuzzer picks from.
var httpMethods = []string{http.MethodGet, http.MethodPost, http.MethodDelete, http.MethodPut, http.MethodPatch, http.MethodHead, http.MethodOptions}

// FuzzHTTP: any request to the HTTP API (method, path and query, body, a
// header, and who sends it: no token, a token of each scope, a forged one)
// is answered, never a panic: a success, or the contract's error body with
// the status of its code, never INTERNAL (500); a request without a valid
// token never succeeds but on /healthz and /readyz, and one whose token
// lacks the route's scope never changes the log. "@id" in the path or body
// stands for the rig's sandbox.
func FuzzHTTP(f *testing.F) {
	for _, s := range []struct {
		method     uint8
		path, body string
		header     string
	}{
		{1, "/v1/sandboxes", `{"name":"db","driver":"sim"}`, "Idempotency-Key: k1"},
		{1, "/v1/sandboxes", `{"name":"web","driver":"sim"}`, ""},
		{1, "/v1/sandboxes", `{"name":`, "Content-Type: application/json"},
		{1, "/v1/sandboxes", `{"driver":"sim","labels":{"a\u0000":"b"}}`, ""},
		{0, "/v1/sandboxes?phase=ready&label=team%3Da&limit=10&cursor=x", ``, ""},
		{0, "/v1/sandboxes?limit=0", ``, ""},
		{0, "/v1/sandboxes?phase=bogus", ``, ""},
		{0, "/v1/sandboxes/@id", ``, ""},
		{0, "/v1/sandboxes/web", ``, ""},
		{0, "/v1/sandboxes/@id?at=1", ``, ""},
		{0, "/v1/sandboxes/@id?at=2026-11-30T10:02:00Z", ``, ""},
		{0, "/v1/sandboxes/@id?at=yesterday", ``, ""},
		{0, "/v1/sandboxes/a..b", ``, ""},
		{0, "/v1/sandboxes/%00", ``, ""},
		{1, "/v1/sandboxes/@id/suspend", ``, "Torpor-Actor: me"},
		{1, "/v1/sandboxes/@id/resume", `{"restart_if_restore_fails":true,"node":"n2"}`, ""},
		{1, "/v1/sandboxes/@id/stop", `{"id":"other"}`, ""},
		{1, "/v1/sandboxes/@id/start", `{"node":"n2"}`, ""},
		{2, "/v1/sandboxes/@id", ``, ""},
		{0, "/v1/sandboxes/@id/events?after=0", ``, ""},
		{0, "/v1/sandboxes/@id/events?after=-1", ``, ""},
		{0, "/v1/sandboxes/@id/logs?tail=5", ``, ""},
		{0, "/v1/sandboxes/@id/logs?tail=0", ``, ""},
		{1, "/v1/sandboxes/@id/forwards", `{"listen":"127.0.0.1:0","port":8000}`, ""},
		{2, "/v1/sandboxes/@id/forwards/f1", ``, ""},
		{1, "/v1/sandboxes/@id/touch", ``, ""},
		{1, "/v1/sandboxes/@id/touch", `{"restart_if_restore_fails":true}`, "Idempotency-Key: t1"},
		{0, "/v1/sandboxes/@id/wait?phase=ready&timeout=1s", ``, ""},
		{0, "/v1/sandboxes/@id/wait?phase=nope", ``, ""},
		{0, "/v1/sandboxes/@id/wait?phase=ready&timeout=-1s&after=x", ``, ""},
		{0, "/v1/watch", ``, "Last-Event-ID: 5"},
		{0, "/v1/watch", ``, "Last-Event-ID: x"},
		{0, "/v1/phases", ``, ""},
		{0, "/v1/drivers", ``, ""},
		{0, "/healthz", ``, ""},
		{0, "/readyz", ``, ""},
		{3, "/v1/sandboxes", `{}`, ""},
		{4, "/nope", ``, ""},
		{6, "/v1/sandboxes/@id/suspend", ``, ""},
	} {
		for who := range uint8(len(fuzzTokens)) {
			f.Add(s.method, s.path, []byte(s.body), s.header, who)
		}
	}
	f.Fuzz(func(t *testing.T, method uint8, path string, body []byte, header string, who uint8) {
		r := newFuzzRig(t)
		tok := fuzzTokens[int(who)%len(fuzzTokens)]
		m := httpMethods[int(method)%len(httpMethods)]
		path = strings.ReplaceAll(path, "@id", r.id)
		body = bytes.ReplaceAll(body, []byte("@id"), []byte(r.id))
		// What a server's parser would hand the handler: a request line it
		// can parse (the rest is refused before any handler runs).
		req, err := http.NewRequestWithContext(fuzzCtx(t), m, "http://torpor.test/", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		if req.URL, err = req.URL.Parse(path); err != nil || req.URL.Host != "torpor.test" {
			return
		}
		req.RequestURI = req.URL.RequestURI()
		req.RemoteAddr = "127.0.0.1:40000"
		req.Header.Set("Content-Type", "application/json")
		if tok.secret != "" {
			req.Header.Set("Authorization", "Bearer "+tok.secret)
		}
		if k, v, ok := strings.Cut(header, ":"); ok && validHeader(k, v) {
			req.Header.Set(k, strings.TrimSpace(v))
		}
		before := r.appended(t)
		w := httptest.NewRecorder()
		NewHTTP(r.svc, logViews{r.svc}, nil, zerolog.Nop()).WithGuard(HTTPGuard{Auth: fuzzAuth{}, Hosts: []string{"torpor.test"}}).ServeHTTP(w, req)
		res := w.Result()
		if auth := req.Header.Get("Authorization"); res.StatusCode < 300 && !strings.HasPrefix(auth, "Bearer torpor_") &&
			req.URL.Path != "/healthz" && req.URL.Path != "/readyz" {
			t.Fatalf("%s %s with Authorization %q: status %d without a valid token", m, path, auth, res.StatusCode)
		}
		readOnly := len(tok.scopes) == 1 && tok.scopes[0] == events.ScopeRead
		if after := r.appended(t); after != before && (readOnly || tok.scopes == nil || res.StatusCode == http.StatusForbidden || res.StatusCode == http.StatusUnauthorized) {
			t.Fatalf("%s %s with scopes %v answered %d, and the log grew %d → %d", m, path, tok.scopes, res.StatusCode, before, after)
		}
		if m == http.MethodGet && res.StatusCode < 300 && !events.Allows(tok.scopes, events.ScopeRead) && req.URL.Path != "/healthz" && req.URL.Path != "/readyz" {
			t.Fatalf("GET %s with scopes %v: status %d, a read without read", path, tok.scopes, res.StatusCode)
		}
		if res.StatusCode < 400 {
			return
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %s: status %d with Content-Type %q, want the contract's JSON error body", m, path, res.StatusCode, ct)
		}
		var eb events.ErrorBody
		dec := json.NewDecoder(res.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&eb); err != nil || eb.Error == nil {
			t.Fatalf("%s %s: status %d, body %q: not the contract's error body (%v)", m, path, res.StatusCode, w.Body.Bytes(), err)
		}
		if eb.Error.Code.HTTPStatus() == http.StatusInternalServerError || eb.Error.Code.HTTPStatus() != res.StatusCode {
			t.Fatalf("%s %s %q: status %d, error %+v: want a known code other than INTERNAL, with its status", m, path, body, res.StatusCode, eb.Error)
		}
	})
}

// fuzzTokens are who sends a fuzzed request: nobody, a token of each
// scope (known to fuzzAuth), a forged one.
var fuzzTokens = []struct {
	secret string
	scopes []events.Scope
}{
	{"", nil},
	{"torpor_r_" + strings.Repeat("r", 43), []events.Scope{events.ScopeRead}},
	{"torpor_w_" + strings.Repeat("w", 43), []events.Scope{events.ScopeWrite}},
	{"torpor_a_" + strings.Repeat("a", 43), []events.Scope{events.ScopeAdmin}},
	{"torpor_x_" + strings.Repeat("x", 43), nil},
}

// fuzzAuth knows the tokens of fuzzTokens that hold scopes.
type fuzzAuth struct{}

func (fuzzAuth) Authenticate(_ context.Context, secret string) (events.TokenInfo, error) {
	for _, t := range fuzzTokens {
		if t.secret == secret && t.scopes != nil {
			return events.TokenInfo{Name: secret[len("torpor_") : len("torpor_")+1], Scopes: t.scopes}, nil
		}
	}
	return events.TokenInfo{}, events.Errorf(events.CodeUnauthenticated, "unknown token")
}

// validHeader is whether net/http's server would take the header k: v
// (a token name, a value without control characters but tabs).
func validHeader(k, v string) bool {
	if k == "" {
		return false
	}
	for _, c := range k {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	for _, c := range []byte(v) {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// FuzzReport: a supervisor report on any sandbox's subject, with any body,
// is taken only with the credential minted for the sandbox and the
// generation it claims; anything else is refused with a contract error
// (a forged or garbled credential UNAUTHENTICATED), never a panic. "@id"
// stands for the rig's sandbox, "@cred" for the credential of its
// generation 1.
func FuzzReport(f *testing.F) {
	for _, s := range []struct{ subject, body string }{
		{"@id", `{"sandbox_id":"@id","generation":1,"credential":"@cred","kind":"attached"}`},
		{"@id", `{"generation":1,"credential":"@cred","kind":"heartbeat"}`},
		{"@id", `{"generation":1,"credential":"@cred","kind":"exited","exit_code":3}`},
		{"@id", `{"generation":1,"credential":"@cred","kind":"detached"}`},
		{"@id", `{"generation":1,"credential":"@cred","kind":"bogus"}`},
		{"@id", `{"generation":2,"credential":"@cred","kind":"attached"}`},
		{"@id", `{"generation":1,"credential":"00","kind":"attached"}`},
		{"@id", `{"generation":1,"credential":"","kind":"exited"}`},
		{"0193b0a4-0000-7000-8000-000000000001", `{"generation":1,"credential":"@cred","kind":"exited"}`},
		{"ZZ", `{"generation":1,"credential":"@cred","kind":"attached"}`},
		{"@id", `{"sandbox_id":"other","generation":1,"credential":"@cred","kind":"attached"}`},
		{"@id", `{"generation":-1,"credential":"@cred"}`},
		{"@id", `{"generation":1e400}`},
		{"@id", `not json`},
		{"@id", ``},
	} {
		f.Add(s.subject, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, subject string, body []byte) {
		r := newFuzzRig(t)
		subject = strings.ReplaceAll(subject, "@id", r.id)
		body = bytes.ReplaceAll(body, []byte("@id"), []byte(r.id))
		body = bytes.ReplaceAll(body, []byte("@cred"), []byte(r.creds.Mint(r.id, 1)))
		got, err := r.svc.Report(fuzzCtx(t), subject, body)
		if err != nil {
			contractError(t, fmt.Sprintf("report on %q %q", subject, body), err)
			return
		}
		if got.Credential != r.creds.Mint(subject, got.Generation) || (got.SandboxID != "" && got.SandboxID != subject) {
			t.Fatalf("report on %q %q taken as %+v: not the credential of %s generation %d", subject, body, got, subject, got.Generation)
		}
	})
}
