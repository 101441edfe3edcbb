// Package servetest starts a real torpor node (services/node, as serve runs
// it, on an embedded NATS server) in the test's process, with a token of
// each scope, for the tests of what talks to torpor from outside Go: the
// TypeScript and Python SDKs and the dashboard in a browser. It also finds
// the programs those tests run (node, npm, python3, chromium): a program
// missing fails the test under CI=true and skips it loudly elsewhere. At
// the test's end the invariant checker reads the node's log: every suite
// that ran against it is judged by events/check too.
package servetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/jsstore"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/node"
)

// Server is a node serving HTTP on loopback, and a token of each scope.
type Server struct {
	// URL is the HTTP API's base, http://127.0.0.1:PORT.
	URL string
	// Admin, Write and Read are bearer tokens: the node's admin token, one
	// with read and write, one with read only.
	Admin, Write, Read string
	// Deadline is the node's deadline of transient phases (serve --deadline).
	Deadline time.Duration
	Node     *node.Node
}

// Deadline is the deadline of transient phases of a Server's node.
const Deadline = 45 * time.Second

// Start starts a node for t, stopped at t's cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	n, err := node.Start(context.Background(), node.Config{Data: filepath.Join(dir, "data"), HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0",
		Fsync: "interval", Node: "servetest", Deadline: Deadline, DuplicateWindow: jsstore.DefaultDuplicateWindow,
		HeartbeatLimit: 15 * time.Second, TokenLimits: node.DefaultTokenLimits, HTTPTimeouts: node.DefaultHTTPTimeouts}, zerolog.Nop())
	if err != nil {
		t.Fatalf("start a node: %v", err)
	}
	t.Cleanup(func() { _ = n.Stop() })
	s := &Server{URL: "http://" + n.HTTPAddr(), Admin: n.AdminToken(), Deadline: Deadline, Node: n}
	// Registered after the stop, so it runs before it: the independent
	// checker over the whole log the test (a suite in another language)
	// produced; a violation fails t.
	t.Cleanup(func() { s.check(t) })
	admin := torpor.New(n.HTTPAddr(), nil).WithToken(s.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for name, to := range map[string]*string{"write": &s.Write, "read": &s.Read} {
		scopes := []events.Scope{events.ScopeRead}
		if name == "write" {
			scopes = append(scopes, events.ScopeWrite)
		}
		tok, err := admin.CreateToken(ctx, torpor.TokenRequest{Name: "servetest-" + name, Scopes: scopes})
		if err != nil {
			t.Fatalf("make the %s token: %v", name, err)
		}
		*to = tok.Token
	}
	return s
}

// check runs the invariant checker (events/check) over s's log, stays
// and clean-ups judged against its deadline, and fails t for each
// violation.
func (s *Server) check(t testing.TB) {
	t.Helper()
	vs, err := check.Replay(context.Background(), s.Node.Store(), check.Options{Deadline: s.Deadline, Slack: 10 * time.Second, Now: time.Now()})
	if err != nil {
		t.Errorf("check the log: %v", err)
	}
	for _, v := range vs {
		t.Errorf("the log breaks an invariant: %v", v)
	}
}

// Env is s as the environment the external suites read: TORPOR_URL,
// TORPOR_ADMIN_TOKEN, TORPOR_WRITE_TOKEN, TORPOR_READ_TOKEN and
// TORPOR_DEADLINE_SECONDS.
func (s *Server) Env() []string {
	return []string{
		"TORPOR_URL=" + s.URL,
		"TORPOR_ADMIN_TOKEN=" + s.Admin,
		"TORPOR_WRITE_TOKEN=" + s.Write,
		"TORPOR_READ_TOKEN=" + s.Read,
		fmt.Sprintf("TORPOR_DEADLINE_SECONDS=%g", s.Deadline.Seconds()),
	}
}

// Need is the path of program, or, where it is missing, a failure under
// CI=true and a loud skip elsewhere (.ci/run installs it).
func Need(t testing.TB, program string) string {
	t.Helper()
	p, err := exec.LookPath(program)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing (.ci/run installs it): %v", program, err)
	}
	t.Skipf("SKIPPING: %s is missing (.ci/run installs it): %v", program, err)
	return ""
}

// NeedDir fails t under CI=true, and skips it elsewhere, when dir (say
// node_modules, which .ci/run fills with `npm ci`) is not there.
func NeedDir(t testing.TB, dir, how string) {
	t.Helper()
	if _, err := os.Stat(dir); err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing (.ci/run makes it: %s)", dir, how)
	}
	t.Skipf("SKIPPING: %s is missing (%s)", dir, how)
}

// Run runs program with args in dir, with env added to this process's
// environment, within timeout; its output goes to t's log, and an exit
// other than 0 fails t. It returns the output.
func Run(t testing.TB, dir string, env []string, timeout time.Duration, program string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, program, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("%s %s (in %s):\n%s", program, strings.Join(args, " "), dir, out.String())
	if ctx.Err() != nil {
		t.Fatalf("%s %s: not done within %s", program, strings.Join(args, " "), timeout)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", program, strings.Join(args, " "), err)
	}
	return out.String()
}
