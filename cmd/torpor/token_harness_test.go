package main

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/access"
)

// testTokens holds the admin token of every server the tests started, by
// its HTTP address (host:port): the tests' own HTTP calls, CLI runs and CLI
// processes send it, as a user on the server's machine does. The tests of
// authentication itself use clients of their own that send what they mean.
var testTokens sync.Map

// registerToken records tok as the token of the server at addr.
func registerToken(addr, tok string) { testTokens.Store(addr, tok) }

// tokenFor is the admin token of the server at server (a URL or host:port),
// "" for a server the tests did not start.
func tokenFor(server string) string {
	host := server
	if u, err := url.Parse(server); err == nil && u.Host != "" {
		host = u.Host
	}
	if tok, ok := testTokens.Load(host); ok {
		return tok.(string)
	}
	return ""
}

// tokenEnv is the environment a CLI process needs to reach server with its
// admin token.
func tokenEnv(server string) []string {
	if tok := tokenFor(server); tok != "" {
		return []string{"TORPOR_TOKEN=" + tok}
	}
	return nil
}

// serverArg is the value of --server in a CLI's args, if any.
func serverArg(args []string) string {
	for i, a := range args {
		if a == "--server" && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--server="); ok {
			return v
		}
	}
	return ""
}

// tokenTransport sends, with every request to a server the tests started,
// its admin token, unless the request carries an Authorization header of
// its own. TestMain makes it the transport of http.DefaultClient (so of
// http.Get and http.Post), which only the tests' plain calls use.
type tokenTransport struct{ base http.RoundTripper }

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Authorization") == "" {
		if tok := tokenFor(r.URL.Host); tok != "" {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+tok)
		}
	}
	return t.base.RoundTrip(r)
}

// client is an SDK client of a, with its admin token.
func appClient(a *app) *torpor.Client {
	return torpor.New(a.HTTPAddr(), nil).WithToken(a.AdminToken())
}

// readAdminToken reads the admin token serve wrote under dir and records it
// as the token of the server at addr.
func readAdminToken(t testing.TB, dir, addr string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, access.AdminFile))
	if err != nil {
		t.Fatalf("admin token: %v", err)
	}
	tok := strings.TrimSpace(string(data))
	registerToken(addr, tok)
	return tok
}

// anonymous is an HTTP client that sends no token of its own accord.
var anonymous = &http.Client{Transport: http.DefaultTransport}
