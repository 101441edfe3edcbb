package access

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
)

const waitFor = 10 * time.Second

func open(t *testing.T, srv *natstest.Server) *Tokens {
	t.Helper()
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Open(t.Context(), js, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tok.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return tok
}

// eventually polls f until it holds or waitFor passes.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	end := time.Now().Add(waitFor)
	for !f() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s", what, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTokenLifecycle: a token made on one instance authenticates with its
// scopes there and on another instance at once; once revoked, neither takes
// it; the bucket keeps its hash, never its secret.
func TestTokenLifecycle(t *testing.T) {
	srv := natstest.Start(t)
	a, b := open(t, srv), open(t, srv)
	ctx := t.Context()

	tok, err := a.Create(ctx, events.TokenRequest{Name: "ci", Scopes: []events.Scope{"write", "read"}}, "token:admin")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok.Token, Prefix+"ci_") || len(tok.Token) != len(Prefix+"ci_")+43 {
		t.Fatalf("secret %q: want %sci_ and 32 random bytes", tok.Token, Prefix)
	}
	if got := tok.Scopes; len(got) != 2 || got[0] != events.ScopeRead || got[1] != events.ScopeWrite {
		t.Errorf("scopes %v, want [read write]", got)
	}
	for name, inst := range map[string]*Tokens{"the instance that made it": a, "another instance": b} {
		info, err := inst.Authenticate(ctx, tok.Token)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if info.Name != "ci" || info.CreatedBy != "token:admin" {
			t.Errorf("%s: %+v", name, info)
		}
	}
	e, err := a.kv.Get(ctx, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(e.Value()), tok.Token) || strings.Contains(string(e.Value()), strings.TrimPrefix(tok.Token, Prefix)) {
		t.Errorf("the bucket holds the secret: %s", e.Value())
	}

	if _, err := a.Create(ctx, events.TokenRequest{Name: "ci", Scopes: []events.Scope{"read"}}, ""); events.CodeOf(err) != events.CodeAlreadyExists {
		t.Errorf("a second token named ci: %v, want ALREADY_EXISTS", err)
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "ci" {
		t.Errorf("list: %+v, %v", list, err)
	}

	if err := b.Revoke(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	for name, inst := range map[string]*Tokens{"the instance that revoked it": b, "another instance": a} {
		eventually(t, name+" refuses the revoked token", func() bool {
			_, err := inst.Authenticate(ctx, tok.Token)
			return events.CodeOf(err) == events.CodeUnauthenticated
		})
	}
	if err := b.Revoke(ctx, "ci"); events.CodeOf(err) != events.CodeNotFound {
		t.Errorf("revoke again: %v, want NOT_FOUND", err)
	}
}

// TestRevokedTokenNotLearntAgain: the put of a token that an instance has
// since revoked, brought late by its watch, does not teach it the token
// again (a token revoked right after its creation was taken for a moment);
// a token made again under the name is learnt.
func TestRevokedTokenNotLearntAgain(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	a, err := Open(ctx, js, 1) // no Run: the test hands it the watch's changes
	if err != nil {
		t.Fatal(err)
	}
	w, err := a.kv.Watch(ctx, "ci", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	next := func(what string) jetstream.KeyValueEntry {
		t.Helper()
		select {
		case e := <-w.Updates():
			if e == nil {
				t.Fatalf("%s: the watch ended", what)
			}
			return e
		case <-time.After(waitFor):
			t.Fatalf("%s: no change within %s", what, waitFor)
			return nil
		}
	}

	tok, err := a.Create(ctx, events.TokenRequest{Name: "ci", Scopes: []events.Scope{"read"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	put := next("the put")
	if err := a.Revoke(ctx, "ci"); err != nil {
		t.Fatal(err)
	}
	a.apply(put) // the watch brings the put after the revocation
	if _, err := a.Authenticate(ctx, tok.Token); events.CodeOf(err) != events.CodeUnauthenticated {
		t.Fatalf("the revoked token after its late put: %v, want UNAUTHENTICATED", err)
	}
	a.apply(next("the delete"))

	again, err := a.Create(ctx, events.TokenRequest{Name: "ci", Scopes: []events.Scope{"read"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	a.apply(next("the second put"))
	if _, err := a.Authenticate(ctx, again.Token); err != nil {
		t.Errorf("the token made again: %v", err)
	}
	if _, err := a.Authenticate(ctx, tok.Token); events.CodeOf(err) != events.CodeUnauthenticated {
		t.Errorf("the first secret after the name was made again: %v, want UNAUTHENTICATED", err)
	}
}

// TestTokensRefused: what Authenticate and Create say to bad input.
func TestTokensRefused(t *testing.T) {
	srv := natstest.Start(t)
	tk := open(t, srv)
	ctx := t.Context()
	good, err := tk.Create(ctx, events.TokenRequest{Name: "good", Scopes: []events.Scope{"read"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, secret string }{
		{"empty", ""},
		{"no prefix", strings.TrimPrefix(good.Token, Prefix)},
		{"another token's name", strings.Replace(good.Token, "good_", "admin_", 1)},
		{"no name", Prefix + good.Token[len(good.Token)-43:]},
		{"one character changed", good.Token[:len(good.Token)-1] + string(good.Token[len(good.Token)-1]^1)},
		{"prefix alone", Prefix},
		{"very long", good.Token + strings.Repeat("a", 4096)},
	} {
		if _, err := tk.Authenticate(ctx, c.secret); events.CodeOf(err) != events.CodeUnauthenticated {
			t.Errorf("%s: %v, want UNAUTHENTICATED", c.name, err)
		}
	}
	for _, c := range []struct {
		name string
		req  events.TokenRequest
		want events.Code
	}{
		{"no scope", events.TokenRequest{Name: "a"}, events.CodeInvalidArgument},
		{"unknown scope", events.TokenRequest{Name: "a", Scopes: []events.Scope{"root"}}, events.CodeInvalidArgument},
		{"bad name", events.TokenRequest{Name: "A B", Scopes: []events.Scope{"read"}}, events.CodeInvalidArgument},
		{"name with a control character", events.TokenRequest{Name: "a\x1bb", Scopes: []events.Scope{"read"}}, events.CodeInvalidArgument},
		{"bad expiry", events.TokenRequest{Name: "a", Scopes: []events.Scope{"read"}, Expires: "soon"}, events.CodeInvalidArgument},
		{"negative expiry", events.TokenRequest{Name: "a", Scopes: []events.Scope{"read"}, Expires: "-1h"}, events.CodeInvalidArgument},
	} {
		if _, err := tk.Create(ctx, c.req, ""); events.CodeOf(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
}

// TestExpiredTokenRefused: a token past its expiry authenticates no more.
func TestExpiredTokenRefused(t *testing.T) {
	srv := natstest.Start(t)
	tk := open(t, srv)
	ctx := t.Context()
	now := time.Now()
	tk.now = func() time.Time { return now }
	tok, err := tk.Create(ctx, events.TokenRequest{Name: "brief", Scopes: []events.Scope{"read"}, Expires: "1h"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if tok.ExpiresAt == nil || !tok.ExpiresAt.Equal(now.UTC().Add(time.Hour)) {
		t.Errorf("expires at %v, want %v", tok.ExpiresAt, now.Add(time.Hour))
	}
	if _, err := tk.Authenticate(ctx, tok.Token); err != nil {
		t.Fatalf("before its expiry: %v", err)
	}
	now = now.Add(time.Hour)
	if _, err := tk.Authenticate(ctx, tok.Token); events.CodeOf(err) != events.CodeUnauthenticated {
		t.Errorf("at its expiry: %v, want UNAUTHENTICATED", err)
	}
}

// TestGarbageInTheBucketGrantsNothing: a value written to the bucket by
// anything but the store (a record naming another key, a record with no
// hash, bytes that are not JSON) authenticates nobody and stops nothing.
func TestGarbageInTheBucketGrantsNothing(t *testing.T) {
	srv := natstest.Start(t)
	tk := open(t, srv)
	ctx := t.Context()
	good, err := tk.Create(ctx, events.TokenRequest{Name: "good", Scopes: []events.Scope{"admin"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	forged := Prefix + "badscope_" + strings.Repeat("A", 43)
	// A copy of good's record under another key, with every scope.
	e, err := tk.kv.Get(ctx, "good")
	if err != nil {
		t.Fatal(err)
	}
	for key, value := range map[string]string{
		"copy":     string(e.Value()),
		"nohash":   `{"name":"nohash","scopes":["admin"],"hash":""}`,
		"garbage":  "\x00\xff not json",
		"badscope": `{"name":"badscope","scopes":["root"],"hash":"` + hash(forged) + `"}`,
	} {
		if _, err := tk.kv.Put(ctx, key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tk.Authenticate(ctx, forged); events.CodeOf(err) != events.CodeUnauthenticated {
		t.Errorf("a record with an unknown scope authenticated: %v", err)
	}
	if err := tk.load(ctx); err != nil {
		t.Fatalf("load over garbage: %v", err)
	}
	info, err := tk.Authenticate(ctx, good.Token)
	if err != nil || info.Name != "good" {
		t.Errorf("good's token after the garbage: %+v, %v (a copy under another name must not take it over)", info, err)
	}
}

// TestBootstrap: the first start writes an admin token to a 0600 file; a
// start with the file keeps it; another node's first start on the same bus
// gets a token of its own; a file whose token was revoked is left alone.
func TestBootstrap(t *testing.T) {
	srv := natstest.Start(t)
	tk := open(t, srv)
	ctx := t.Context()
	dir := t.TempDir()
	path := filepath.Join(dir, "data", AdminFile)

	name, minted, err := tk.Bootstrap(ctx, path, "local")
	if err != nil || name != "admin" || !minted {
		t.Fatalf("first start: %q, minted %v, %v", name, minted, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	data, _ := os.ReadFile(path)
	secret := strings.TrimSpace(string(data))
	info, err := tk.Authenticate(ctx, secret)
	if err != nil || !events.Allows(info.Scopes, events.ScopeAdmin) {
		t.Fatalf("the file's token: %+v, %v", info, err)
	}

	name, minted, err = tk.Bootstrap(ctx, path, "local")
	if err != nil || name != "admin" || minted {
		t.Errorf("second start: %q, minted %v, %v; want the same token kept", name, minted, err)
	}
	if again, _ := os.ReadFile(path); string(again) != string(data) {
		t.Error("the second start rewrote the file")
	}

	other := filepath.Join(dir, "other", AdminFile)
	name, minted, err = tk.Bootstrap(ctx, other, "n2")
	if err != nil || name != "admin-n2" || !minted {
		t.Errorf("another node: %q, minted %v, %v; want admin-n2", name, minted, err)
	}
	if _, err := tk.Authenticate(ctx, secret); err != nil {
		t.Errorf("the first node's token after the second's bootstrap: %v", err)
	}

	if err := tk.Revoke(ctx, "admin"); err != nil {
		t.Fatal(err)
	}
	name, minted, err = tk.Bootstrap(ctx, path, "local")
	if err != nil || name != "" || minted {
		t.Errorf("after a revoke: %q, minted %v, %v; want nothing minted", name, minted, err)
	}
}

// TestParseScopes: the scope lists the CLI and API take.
func TestParseScopes(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
		ok   bool
	}{
		{[]string{"read"}, "read", true},
		{[]string{"write,read"}, "read,write", true},
		{[]string{"admin", "read", "admin"}, "read,admin", true},
		{[]string{""}, "", false},
		{nil, "", false},
		{[]string{"read,sudo"}, "", false},
	} {
		got, err := events.ParseScopes(c.in)
		if (err == nil) != c.ok {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		var names []string
		for _, s := range got {
			names = append(names, string(s))
		}
		if strings.Join(names, ",") != c.want {
			t.Errorf("%q: %v, want %s", c.in, got, c.want)
		}
	}
	if !events.Allows([]events.Scope{"admin"}, "write") || events.Allows([]events.Scope{"read"}, "write") || events.Allows(nil, "read") {
		t.Error("Allows: admin holds every scope, read does not hold write, nothing holds nothing")
	}
}
