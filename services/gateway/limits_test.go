package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
)

// blockingViews is a Views whose reads find nothing and whose waits and
// watches hold until their request ends (what a slow client costs).
type blockingViews struct{}

func (blockingViews) Get(context.Context, string) (events.View, error) {
	return events.View{}, events.ErrNotFound
}
func (blockingViews) List(context.Context, ListQuery) (events.Page, error) { return events.Page{}, nil }
func (blockingViews) Wait(ctx context.Context, _ string, _ events.Phase, _ uint64) (events.View, error) {
	<-ctx.Done()
	return events.View{}, ctx.Err()
}
func (blockingViews) Settle(ctx context.Context, _ string, _ uint64) (events.View, error) {
	<-ctx.Done()
	return events.View{}, ctx.Err()
}
func (blockingViews) Counts(context.Context) (map[events.Phase]int, error) { return nil, nil }
func (blockingViews) Watch(ctx context.Context, _ uint64) (<-chan events.View, error) {
	ch := make(chan events.View)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

// limitsServer is the HTTP API of a service with limits lim over the rig's
// log.
func limitsServer(t *testing.T, r *rig, lim Limits) (*Service, string) {
	svc, _, url := limitsHTTP(t, r, lim)
	return svc, url
}

func limitsHTTP(t *testing.T, r *rig, lim Limits) (*Service, *HTTP, string) {
	t.Helper()
	svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{Limits: lim}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	h := NewHTTP(svc, blockingViews{}, nil, zerolog.Nop())
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return svc, h, srv.URL
}

func do(t *testing.T, method, url, body string) (int, events.ErrorBody) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var eb events.ErrorBody
	_ = json.Unmarshal(data, &eb)
	return resp.StatusCode, eb
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCreateLimits: a create whose labels, env, driver options or command
// break a rule or a bound is INVALID_ARGUMENT, and appends nothing; one at
// the bounds is created.
func TestCreateLimits(t *testing.T) {
	r := newRig(t)
	_, base := limitsServer(t, r, Limits{})
	many := func(n int, val string) map[string]string {
		m := map[string]string{}
		for i := range n {
			m["k"+strings.Repeat("x", i%5)+string(rune('a'+i%26))+strings.Repeat("0", i/130)+string(rune('a'+i/26%26))] = val
		}
		return m
	}
	args := func(n, size int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = strings.Repeat("a", size)
		}
		return out
	}
	cases := []struct {
		name string
		req  events.CreateRequest
		code events.Code // "" for created
	}{
		{"plain", events.CreateRequest{Labels: map[string]string{"team": "a b/c", "café": "ünï"}}, ""},
		{"label value with NUL", events.CreateRequest{Labels: map[string]string{"k": "a\x00b"}}, events.CodeInvalidArgument},
		{"label value with ESC", events.CreateRequest{Labels: map[string]string{"k": "\x1b[31mred"}}, events.CodeInvalidArgument},
		{"label value with a newline", events.CreateRequest{Labels: map[string]string{"k": "a\nb"}}, events.CodeInvalidArgument},
		{"label value with a tab", events.CreateRequest{Labels: map[string]string{"k": "a\tb"}}, events.CodeInvalidArgument},
		{"label value with a bidi override", events.CreateRequest{Labels: map[string]string{"k": "a\u202eb"}}, events.CodeInvalidArgument},
		{"label key with a newline", events.CreateRequest{Labels: map[string]string{"a\nb": "v"}}, events.CodeInvalidArgument},
		{"label key with '='", events.CreateRequest{Labels: map[string]string{"a=b": "v"}}, events.CodeInvalidArgument},
		{"empty label key", events.CreateRequest{Labels: map[string]string{"": "v"}}, events.CodeInvalidArgument},
		{"label key of 64 bytes", events.CreateRequest{Labels: map[string]string{strings.Repeat("k", 64): "v"}}, events.CodeInvalidArgument},
		{"label key of 63 bytes", events.CreateRequest{Labels: map[string]string{strings.Repeat("k", 63): "v"}}, ""},
		{"label value of 257 bytes", events.CreateRequest{Labels: map[string]string{"k": strings.Repeat("v", 257)}}, events.CodeInvalidArgument},
		{"label value of 256 bytes", events.CreateRequest{Labels: map[string]string{"k": strings.Repeat("v", 256)}}, ""},
		{"65 labels", events.CreateRequest{Labels: many(65, "v")}, events.CodeInvalidArgument},
		{"64 labels", events.CreateRequest{Labels: many(64, "v")}, ""},
		{"env name with NUL", events.CreateRequest{Env: map[string]string{"A\x00B": "v"}}, events.CodeInvalidArgument},
		{"env name with '='", events.CreateRequest{Env: map[string]string{"A=B": "v"}}, events.CodeInvalidArgument},
		{"empty env name", events.CreateRequest{Env: map[string]string{"": "v"}}, events.CodeInvalidArgument},
		{"env value with NUL", events.CreateRequest{Env: map[string]string{"A": "x\x00y"}}, events.CodeInvalidArgument},
		{"env value with a newline", events.CreateRequest{Env: map[string]string{"PEM": "-----BEGIN\nabc\n-----END"}}, ""},
		{"env value over 8 KiB", events.CreateRequest{Env: map[string]string{"A": strings.Repeat("v", 8<<10+1)}}, events.CodeInvalidArgument},
		{"129 env variables", events.CreateRequest{Env: many(129, "v")}, events.CodeInvalidArgument},
		{"driver option value with ESC", events.CreateRequest{DriverOptions: map[string]string{"o": "\x1b"}}, events.CodeInvalidArgument},
		{"65 driver options", events.CreateRequest{DriverOptions: many(65, "v")}, events.CodeInvalidArgument},
		{"command argument with NUL", events.CreateRequest{Command: []string{"sh", "-c", "a\x00b"}}, events.CodeInvalidArgument},
		{"257 command arguments", events.CreateRequest{Command: args(257, 1)}, events.CodeInvalidArgument},
		{"256 command arguments", events.CreateRequest{Command: args(256, 1)}, ""},
		{"command over 16 KiB", events.CreateRequest{Command: args(17, 1<<10)}, events.CodeInvalidArgument},
		{"name with two dots in a row", events.CreateRequest{Name: "a..b"}, events.CodeInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, eb := do(t, "POST", base+"/v1/sandboxes", jsonOf(t, tc.req))
			if tc.code == "" {
				if status != http.StatusCreated {
					t.Fatalf("got %d %+v, want 201", status, eb.Error)
				}
				return
			}
			if eb.Error == nil || eb.Error.Code != tc.code || status != tc.code.HTTPStatus() || eb.Error.Message == "" {
				t.Fatalf("got %d %+v, want %s", status, eb.Error, tc.code)
			}
		})
	}
}

// TestOddPathRefs: an id or name in a path that is neither a uuid nor a
// valid name is INVALID_ARGUMENT, a well-formed unknown one NOT_FOUND;
// never a 500.
func TestOddPathRefs(t *testing.T) {
	r := newRig(t)
	_, base := limitsServer(t, r, Limits{})
	cases := []struct {
		path string
		code events.Code
	}{
		{"/v1/sandboxes/a..b", events.CodeInvalidArgument},
		{"/v1/sandboxes/a..b/logs", events.CodeInvalidArgument},
		{"/v1/sandboxes/a..b/events", events.CodeInvalidArgument},
		{"/v1/sandboxes/a..b/wait?phase=ready", events.CodeInvalidArgument},
		{"/v1/sandboxes/.a", events.CodeInvalidArgument},
		{"/v1/sandboxes/a.", events.CodeInvalidArgument},
		{"/v1/sandboxes/a%00b", events.CodeInvalidArgument},
		{"/v1/sandboxes/a%2A", events.CodeInvalidArgument},
		{"/v1/sandboxes/" + strings.Repeat("a", 64), events.CodeInvalidArgument},
		{"/v1/sandboxes/a.b", events.CodeNotFound},
		{"/v1/sandboxes/a.b/logs", events.CodeNotFound},
		{"/v1/sandboxes/0193b0a4-0000-7000-8000-0000000000ff", events.CodeNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			status, eb := do(t, "GET", base+tc.path, "")
			if eb.Error == nil || eb.Error.Code != tc.code || status != tc.code.HTTPStatus() {
				t.Fatalf("got %d %+v, want %s", status, eb.Error, tc.code)
			}
		})
	}
}

// TestEventSizeLimit: a command whose events exceed the event limit is
// INVALID_ARGUMENT before anything is appended; one under it lands.
func TestEventSizeLimit(t *testing.T) {
	r := newRig(t)
	svc, _ := limitsServer(t, r, Limits{Event: 8 << 10, CommandBytes: 64 << 10})
	ctx := context.Background()
	before, err := r.store.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Command: []string{strings.Repeat("a", 9<<10)}}})
	if got := events.CodeOf(err); got != events.CodeInvalidArgument {
		t.Fatalf("an append over the limit: got %s (%v), want INVALID_ARGUMENT", got, err)
	}
	if after, _ := r.store.LastSeq(ctx); after != before {
		t.Fatalf("the log moved from %d to %d: the refused create was appended", before, after)
	}
	if _, err := svc.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Command: []string{strings.Repeat("a", 7<<10)}}}); err != nil {
		t.Fatalf("an append under the limit: %v", err)
	}
}

// TestWatchAndWaitLimits: watches and waits beyond the server's limits are
// refused at once, RESOURCE_EXHAUSTED; one that ends frees its place.
func TestWatchAndWaitLimits(t *testing.T) {
	r := newRig(t)
	svc, h, base := limitsHTTP(t, r, Limits{Watches: 2, Waits: 3})
	v, err := svc.Handle(context.Background(), Command{Verb: VerbCreate})
	if err != nil {
		t.Fatal(err)
	}
	wait := base + "/v1/sandboxes/" + v.ID + "/wait?phase=stopped&timeout="
	cases := []struct {
		name        string
		held, probe string // a request the server holds; one it answers at once when admitted
		admitted    int    // the status of an admitted probe
		limit       int
	}{
		{"watches", base + "/v1/watch", base + "/v1/watch", http.StatusOK, 2},
		{"waits", wait + "10m", wait + "1ms", http.StatusGatewayTimeout, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// get answers the status of url, and a cancel that ends the
			// request (a held one goes on until then).
			get := func(url string) (int, events.Code, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				var eb events.ErrorBody
				if resp.StatusCode != http.StatusOK {
					_ = json.NewDecoder(resp.Body).Decode(&eb)
					resp.Body.Close()
				}
				if eb.Error == nil {
					return resp.StatusCode, "", cancel
				}
				return resp.StatusCode, eb.Error.Code, cancel
			}
			var first context.CancelFunc
			for i := range tc.limit {
				if tc.name == "watches" {
					status, _, cancel := get(tc.held)
					if status != http.StatusOK {
						t.Fatalf("watch %d: %d", i, status)
					}
					first = cmpOr(first, cancel)
					continue
				}
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				first = cmpOr(first, cancel)
				req, _ := http.NewRequestWithContext(ctx, "GET", tc.held, nil)
				go func() {
					if resp, err := http.DefaultClient.Do(req); err == nil {
						resp.Body.Close()
					}
				}()
			}
			// The held waits answer only at their end: wait until the
			// server counts them all.
			for h.waits.Load() < int64(tc.limit) && tc.name == "waits" {
				runtime.Gosched()
			}
			if status, code, cancel := get(tc.probe); status != http.StatusTooManyRequests || code != events.CodeResourceExhausted {
				cancel()
				t.Fatalf("one beyond the limit: got %d %s, want 429 RESOURCE_EXHAUSTED", status, code)
			}
			first() // one ends: its place is free again
			for {
				status, code, cancel := get(tc.probe)
				cancel()
				if status == tc.admitted {
					break
				}
				if status != http.StatusTooManyRequests || code != events.CodeResourceExhausted {
					t.Fatalf("after one ended: got %d %s", status, code)
				}
			}
		})
	}
}

// cmpOr is a if set, else b.
func cmpOr(a, b context.CancelFunc) context.CancelFunc {
	if a != nil {
		return a
	}
	return b
}

// TestFullStorageIsResourceExhausted: a command that a full log, or a full
// names bucket, cannot take is RESOURCE_EXHAUSTED (429), never INTERNAL.
func TestFullStorageIsResourceExhausted(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		store jsstore.Config
		names int64 // the names bucket's bound, 0 for its default
	}{
		{"full log", jsstore.Config{MaxBytes: 16 << 10}, 0},
		{"full names bucket", jsstore.Config{}, 4 << 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.Start(t)
			store, err := jsstore.New(ctx, srv.JS, tc.store)
			if err != nil {
				t.Fatal(err)
			}
			names, err := NewKVNames(ctx, srv.JS, 1)
			if err != nil {
				t.Fatal(err)
			}
			if tc.names != 0 {
				if _, err := srv.JS.UpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "torpor_names", MaxBytes: tc.names}); err != nil {
					t.Fatal(err)
				}
			}
			creds, _ := compute.NewCredentials([]byte("0123456789abcdef0123456789abcdef"))
			svc, err := NewService(store, names, fakeDrivers{}, creds, Config{}, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			srvHTTP := httptest.NewServer(NewHTTP(svc, blockingViews{}, nil, zerolog.Nop()))
			t.Cleanup(srvHTTP.Close)
			for i := range 1000 {
				status, eb := do(t, "POST", srvHTTP.URL+"/v1/sandboxes", `{"labels":{"pad":"`+strings.Repeat("x", 200)+`"}}`)
				if status == http.StatusCreated {
					continue
				}
				if eb.Error == nil || eb.Error.Code != events.CodeResourceExhausted || status != http.StatusTooManyRequests {
					t.Fatalf("create %d: got %d %+v, want 429 RESOURCE_EXHAUSTED", i, status, eb.Error)
				}
				return
			}
			t.Fatal("1000 creates fit")
		})
	}
}
