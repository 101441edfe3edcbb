// Package natstest starts in-process nats-server instances with JetStream for
// tests: storage under t.TempDir(), no listening socket, everything stopped by
// t.Cleanup. Tests talk to a real server, never to a mock.
package natstest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/internal/embedded"
)

// Server is a running in-process server and one client connection to it.
type Server struct {
	*server.Server
	Dir  string
	Conn *nats.Conn
	JS   jetstream.JetStream
	// user connects as torpor's service when Dir has bus keys.
	user []nats.Option
}

// Options tune Start.
type Options struct {
	// Dir is the data directory, laid out as torpor serve's --data (the
	// store under Dir/jetstream); empty means a new t.TempDir(). Passing
	// the Dir of a stopped server, or of a stopped service, restarts on
	// its data. A Dir with bus keys (<Dir>/auth, as serve makes them)
	// runs the server with their operator, and connects as the service.
	Dir string
	// Listen makes the server accept TCP clients on a random loopback port
	// (for tests of code that dials a URL).
	Listen bool
	// SyncAlways fsyncs every write, as torpor serve --fsync always does;
	// otherwise the server syncs on its interval.
	SyncAlways bool
}

// Start runs a JetStream server with default options.
func Start(t testing.TB) *Server { return StartWith(t, Options{}) }

// StartWith runs a JetStream server with opts.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	dir := opts.Dir
	if dir == "" {
		dir = t.TempDir()
	}
	cfg := embedded.Config{Data: dir, Name: "torpor-test", SyncAlways: opts.SyncAlways}
	if opts.Listen {
		cfg.Listen = "127.0.0.1:0"
	}
	var user []nats.Option
	if _, err := os.Stat(filepath.Join(dir, "auth", busauth.AccountFile)); err == nil {
		auth, err := busauth.Open(filepath.Join(dir, "auth"), busauth.NoLimits)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Operator, cfg.Accounts, cfg.SystemAccount = auth.OperatorJWT, auth.Accounts(), auth.SystemKey
		u, err := auth.User("natstest", 0, busauth.Grant{Role: busauth.Service})
		if err != nil {
			t.Fatal(err)
		}
		user = u.Options()
	}
	s, err := embedded.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("", append(user, nats.InProcessServer(s))...)
	if err != nil {
		s.Shutdown()
		t.Fatalf("connect: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	srv := &Server{Server: s, Dir: dir, Conn: nc, JS: js, user: user}
	t.Cleanup(srv.Stop)
	return srv
}

// Connect opens another in-process client connection, closed at cleanup.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("", append(s.user, nats.InProcessServer(s.Server))...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Stop closes the client and shuts the server down, waiting for it; safe to
// call twice.
func (s *Server) Stop() {
	s.Conn.Close()
	s.Shutdown()
	s.WaitForShutdown()
}
