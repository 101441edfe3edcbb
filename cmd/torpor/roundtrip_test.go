package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/torpor/torpor/events"
)

// recorder is a proxy to a server that records each request it passes on
// ("POST /v1/…?query"), and, as an older server would, can drop the query
// of a command (a server that does not know wait=true ignores it).
type recorder struct {
	mu      sync.Mutex
	seen    []string
	noQuery bool
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.seen
	r.seen = nil
	return out
}

func newRecorder(t *testing.T, server string) (*recorder, string) {
	t.Helper()
	target, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		rec.mu.Lock()
		rec.seen = append(rec.seen, req.Method+" "+req.URL.RequestURI())
		drop := rec.noQuery && req.Method != http.MethodGet
		rec.mu.Unlock()
		if drop {
			req.URL.RawQuery = ""
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return rec, srv.URL
}

// TestLifecycleVerbsOneRoundTrip: create and each lifecycle verb send their
// command with wait=true and wait no more (no GET …/wait): one round trip
// after the look-up of the name; against a server that ignores wait=true
// (it answers the view as accepted) they fall back to the long poll and
// still end in the target phase.
func TestLifecycleVerbsOneRoundTrip(t *testing.T) {
	a := startApp(t, "", nil)
	server := "http://" + a.HTTPAddr()
	rec, proxied := newRecorder(t, server)
	tok := tokenFor(server)
	torpor := func(args ...string) events.View {
		t.Helper()
		var out, errb bytes.Buffer
		pre := []string{"--server", proxied, "-o", "json"}
		if tok != "" {
			pre = append(pre, "--token", tok)
		}
		if code := run(context.Background(), append(pre, args...), &out, &errb); code != 0 {
			t.Fatalf("torpor %v: exit %d, %s", args, code, errb.String())
		}
		var v events.View
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Fatalf("torpor %v: %v\n%s", args, err, out.String())
		}
		return v
	}
	commands := func(seen []string) (waited, polls int) {
		for _, s := range seen {
			switch {
			case strings.Contains(s, "/wait?"):
				polls++
			case strings.Contains(s, "wait=true"):
				waited++
			}
		}
		return waited, polls
	}
	for _, c := range []struct {
		args []string
		want events.Phase
	}{
		{[]string{"create", "rtt"}, events.PhaseReady},
		{[]string{"suspend", "rtt"}, events.PhaseSuspended},
		{[]string{"resume", "rtt"}, events.PhaseReady},
		{[]string{"stop", "rtt"}, events.PhaseStopped},
		{[]string{"start", "rtt"}, events.PhaseReady},
	} {
		if v := torpor(c.args...); v.Phase != c.want {
			t.Fatalf("torpor %v: %+v, want %s", c.args, v, c.want)
		}
		seen := rec.take()
		if waited, polls := commands(seen); waited != 1 || polls != 0 {
			t.Fatalf("torpor %v sent %v: want one command with wait=true and no wait of its own", c.args, seen)
		}
	}
	rec.noQuery = true
	for _, c := range []struct {
		args []string
		want events.Phase
	}{
		{[]string{"suspend", "rtt"}, events.PhaseSuspended},
		{[]string{"create", "rtt-old"}, events.PhaseReady},
	} {
		if v := torpor(c.args...); v.Phase != c.want {
			t.Fatalf("torpor %v against a server that ignores wait=true: %+v, want %s", c.args, v, c.want)
		}
		if _, polls := commands(rec.take()); polls == 0 {
			t.Fatalf("torpor %v against a server that ignores wait=true: no long poll", c.args)
		}
	}
}
