package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/busauth"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
)

// serviceOptions connect as the service of the data directory dir (a
// `torpor serve` of this test's, in a process of its own).
func serviceOptions(t *testing.T, dir string) []nats.Option {
	t.Helper()
	auth, err := busauth.Open(filepath.Join(dir, "auth"), busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	u, err := auth.User("test", time.Hour, busauth.Grant{Role: busauth.Service})
	if err != nil {
		t.Fatal(err)
	}
	return u.Options()
}

// credsFile writes, with `torpor creds`, the credentials of a user of the
// service on dir holding roles (a comma list; node scopes a driver) and
// returns its path.
func credsFile(t *testing.T, dir, roles, node string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), strings.ReplaceAll(roles, ",", "+")+".creds")
	args := []string{"creds", "--data", dir, "--role", roles, "-o", out}
	if node != "" {
		args = append(args, "--node", node)
	}
	var stdout, stderr strings.Builder
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("torpor %s: %d %s", strings.Join(args, " "), code, stderr.String())
	}
	return out
}

// simCredsFile is credsFile of a driver of node that reports for its
// sim's sandboxes (--sim-reports).
func simCredsFile(t *testing.T, dir, node string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), node+"-sim.creds")
	args := []string{"creds", "--data", dir, "--role", "driver", "--node", node, "--sim-reports", "-o", out}
	var stdout, stderr strings.Builder
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("torpor %s: %d %s", strings.Join(args, " "), code, stderr.String())
	}
	return out
}

// TestBusAnonymousRefused: the service's NATS takes no client without a
// credential (before the accounts, anyone could do anything on it).
func TestBusAnonymousRefused(t *testing.T) {
	a := startApp(t, "", nil)
	nc, err := nats.Connect(a.NATSURL(), nats.NoReconnect())
	if err == nil {
		nc.Close()
	}
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("anonymous connect: got %v, want the server's authorization violation", err)
	}
}

// TestCredsFileMode: `torpor creds` writes a file only its owner reads,
// and refuses roles it cannot mint.
func TestCredsFileMode(t *testing.T) {
	dir := t.TempDir()
	path := credsFile(t, dir, "producer,dashboard", "")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("mode %o, want 600", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"creds", "--data", dir, "--role", "supervisor", "-o", path}, "INVALID_ARGUMENT: --role"},
		{[]string{"creds", "--data", dir, "--role", "driver", "-o", path}, "INVALID_ARGUMENT: --role"},
		{[]string{"creds", "--data", dir, "--role", "root", "-o", path}, "INVALID_ARGUMENT: --role"},
		{[]string{"creds", "--data", dir, "--role", "producer", "--sim-reports", "-o", path}, "INVALID_ARGUMENT: --role: --sim-reports: only a driver"},
		{[]string{"creds", "--data", dir, "--role", "producer"}, "INVALID_ARGUMENT: -o"},
	} {
		var stdout, stderr strings.Builder
		if code := run(context.Background(), tc.args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("torpor %v: %d %q, want %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// refusal is the server's refusal of one publication or subscription,
// seen by the connection's error handler.
type refusals chan error

func (r refusals) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	select {
	case r <- err:
	default:
	}
}

// refusedIn bounds the wait for a refusal: the server sends it before it
// answers the flush that follows, so it is there at once when it comes.
const refusedIn = 2 * time.Second

// want waits for the server's permissions violation naming subject.
func (r refusals) want(t *testing.T, subject string) {
	t.Helper()
	select {
	case err := <-r:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") || !strings.Contains(err.Error(), subject) {
			t.Errorf("got %v, want a permissions violation for %s", err, subject)
		}
	case <-time.After(refusedIn):
		t.Errorf("%s: not refused", subject)
	}
}

// TestBusRolesRefused: against the running service, each role's
// credentials file (from `torpor creds`, or a supervisor's as the service
// mints it) is refused, by the nats-server itself, each thing the role
// must not do: forge an event of a live sandbox, delete the stream, read
// torpor_config, join the queue group torpor on the commands, call another
// node's driver, speak for another sandbox, write the view. The sandbox, the
// stream, the view and the commands are as they were after.
func TestBusRolesRefused(t *testing.T) {
	a := startApp(t, "", nil)
	svc := busConn(t, a)
	sb, cerr := busCmd(t, svc, "create", map[string]any{"name": "kept", "driver": "sim"}, nil)
	if cerr != nil {
		t.Fatal(cerr)
	}
	other, cerr := busCmd(t, svc, "create", map[string]any{"name": "other", "driver": "sim"}, nil)
	if cerr != nil {
		t.Fatal(cerr)
	}
	dir := a.Data()
	sup, err := a.Auth().User("supervisor", time.Hour, busauth.Grant{Role: busauth.Supervisor, Sandbox: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	supCreds, _ := sup.Creds()
	supFile := filepath.Join(t.TempDir(), "sup.creds")
	if err := os.WriteFile(supFile, supCreds, 0o600); err != nil {
		t.Fatal(err)
	}
	users := []struct{ name, file string }{
		{"producer", credsFile(t, dir, "producer", "")},
		{"dashboard", credsFile(t, dir, "dashboard", "")},
		{"producer,dashboard", credsFile(t, dir, "producer,dashboard", "")},
		{"driver n1", credsFile(t, dir, "driver", "n1")},
		{"supervisor", supFile},
	}
	ctx := context.Background()
	for _, u := range users {
		t.Run(u.name, func(t *testing.T) {
			errs := make(refusals, 8)
			nc, err := nats.Connect(a.NATSURL(), torpor.Credentials(u.file), nats.ErrorHandler(errs.handler))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			pub := func(subject string, data []byte) {
				t.Helper()
				if err := nc.Publish(subject, data); err != nil {
					t.Fatal(err)
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				errs.want(t, subject)
			}
			// Forge the sandbox's deletion, in the store's own form.
			pub("torpor.sandbox."+sb.ID, []byte(`{"type":"sandbox.deleted"}`))
			pub("$JS.API.STREAM.DELETE.TORPOR_EVENTS", nil)
			pub("$JS.API.DIRECT.GET.KV_torpor_config.$KV.torpor_config.credential_secret", nil)
			pub("torpor.driver.n2.start", []byte(`{}`))
			pub("$KV.torpor_phases."+sb.ID, []byte(`{"phase":"error"}`))
			// Speak for a sandbox: another's (a supervisor's), another
			// node's (a driver's of n1: both run on the service's own
			// node), or any (a driver not minted --sim-reports).
			pub(compute.ReportSubject(other.ID), []byte(`{}`))
			if u.name == "driver n1" {
				pub(compute.ReportSubject(sb.ID), []byte(`{}`))
			}
			// Issue 23, row 8: purge the names, or point one at another
			// sandbox (then `torpor delete kept` deleted other).
			pub("$JS.API.STREAM.PURGE.KV_torpor_names", []byte(`{}`))
			pub("$KV.torpor_names.kept", []byte(other.ID))
			if _, err := nc.QueueSubscribe("torpor.cmd.>", "torpor", func(m *nats.Msg) { _ = m.Respond([]byte(`{"forged":true}`)) }); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			errs.want(t, "torpor.cmd.>")
			// With the jetstream API, the read of torpor_config gets no
			// answer at all.
			js, _ := jetstream.New(nc)
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			if kv, err := js.KeyValue(rctx, "torpor_config"); err == nil {
				if e, err := kv.Get(rctx, "credential_secret"); err == nil {
					t.Errorf("read torpor_config: %q", e.Value())
				}
			}
			cancel()
		})
	}
	// Nothing moved: the sandbox and the stream are there, the view says
	// ready, and every command is answered by the service.
	got, err := a.Service().Sandbox(ctx, sb.ID)
	if err != nil || got.Phase != events.PhaseReady && got.Phase != events.PhaseProvisioning {
		t.Fatalf("the sandbox after: %+v %v", got, err)
	}
	if v, cerr := busCmd(t, svc, "stop", map[string]any{"id": sb.ID}, nil); cerr != nil || v.ID != sb.ID {
		t.Errorf("a command after: %+v %v, want the service's answer", v, cerr)
	}
	if kv := kvView(t, svc, sb.ID); kv.Phase == events.PhaseError || kv.Phase == events.PhaseDeleted {
		t.Errorf("the view after: %+v", kv)
	}
	js, _ := jetstream.New(svc)
	if _, err := js.Stream(ctx, "TORPOR_EVENTS"); err != nil {
		t.Errorf("the stream after: %v", err)
	}
	names, err := js.KeyValue(ctx, "torpor_names")
	if err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]string{"kept": sb.ID, "other": other.ID} {
		e, err := names.Get(ctx, name)
		if got := ""; err != nil || string(e.Value()) != id {
			if err == nil {
				got = string(e.Value())
			}
			t.Errorf("torpor_names %s after: %q %v, want %s", name, got, err, id)
		}
	}
}

// TestBusRolesAllowed: a producer's credentials create a sandbox on
// torpor.cmd.create; a dashboard's watch the phase view and read the
// stream; a driver's serve its own node.
func TestBusRolesAllowed(t *testing.T) {
	a := startApp(t, "", nil)
	dir := a.Data()
	ctx := context.Background()
	connect := func(file string) *nats.Conn {
		t.Helper()
		nc, err := nats.Connect(a.NATSURL(), torpor.Credentials(file))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	dash := connect(credsFile(t, dir, "dashboard", ""))
	js, _ := jetstream.New(dash)
	kv, err := js.KeyValue(ctx, "torpor_phases")
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()

	prod := connect(credsFile(t, dir, "producer", ""))
	v, cerr := busCmd(t, prod, "create", map[string]any{"name": "made", "driver": "sim"}, nil)
	if cerr != nil {
		t.Fatalf("producer create: %v", cerr)
	}
	deadline := time.After(waitFor)
	for seen := false; !seen; {
		select {
		case e := <-w.Updates():
			seen = e != nil && e.Key() == v.ID
		case <-deadline:
			t.Fatalf("the dashboard's watch never saw %s", v.ID)
		}
	}
	s, err := js.Stream(ctx, "TORPOR_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	// The copies of the view and of the log follow their origins each on
	// its own: the log's may show the event a moment after the view's.
	for end := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		m, err := s.GetLastMsgForSubject(ctx, "torpor.sandbox."+v.ID)
		if err == nil && len(m.Data) > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("dashboard's read of the stream: %v", err)
		}
	}

	drv := connect(credsFile(t, dir, "driver", "n1"))
	if _, err := drv.QueueSubscribe("torpor.driver.n1.>", "torpor-driver", func(m *nats.Msg) { _ = m.Respond([]byte("served")) }); err != nil {
		t.Fatal(err)
	}
	if err := drv.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := busConn(t, a).Request("torpor.driver.n1.observe", []byte(`{}`), waitFor); err != nil || string(m.Data) != "served" {
		t.Errorf("the service's call of n1: %v %v", m, err)
	}
}

// deployNATSOptions are the options of deploy/nats/torpor.conf with the
// auth.conf of the bus keys of data (`torpor creds --server-config`)
// beside it.
func deployNATSOptions(t *testing.T, data string) *server.Options {
	t.Helper()
	conf, err := os.ReadFile("../../deploy/nats/torpor.conf")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "torpor.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"creds", "--data", data, "--server-config", filepath.Join(dir, "auth.conf")}, &stdout, &stderr); code != 0 {
		t.Fatalf("torpor creds --server-config: %d %s", code, stderr.String())
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("deploy/nats/torpor.conf: %v", err)
	}
	if len(opts.TrustedOperators) != 1 || opts.SystemAccount == "" {
		t.Fatalf("deploy/nats/torpor.conf with auth.conf: operators %d, system account %q; want torpor's", len(opts.TrustedOperators), opts.SystemAccount)
	}
	return opts
}

// TestExternalNATSWithAccounts: torpor runs against a nats-server started
// apart from it, from deploy/nats/torpor.conf and the auth.conf of its
// keys: `serve --nats-url --nats-creds service.creds` joins it, an
// anonymous client is refused, a producer's credentials create a sandbox,
// and a process sandbox's supervisor (its user minted by this serve, which
// holds the keys in its --data) attaches.
func TestExternalNATSWithAccounts(t *testing.T) {
	dir := t.TempDir()
	opts := deployNATSOptions(t, dir)
	opts.Host, opts.Port, opts.StoreDir, opts.NoSigs, opts.NoLog = "127.0.0.1", server.RANDOM_PORT, filepath.Join(t.TempDir(), "jetstream"), true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(waitFor) {
		t.Fatal("nats-server not ready")
	}
	if nc, err := nats.Connect(ns.ClientURL(), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("the server took an anonymous client")
	}
	svcCreds := credsFile(t, dir, "service", "")
	bin := binary(t)
	t.Cleanup(func() { deleteProcessSandboxes(t, dir) })
	a := startApp(t, dir, func(c *serveConfig) {
		c.NATSURL, c.NATSCreds, c.NATSListen, c.Torpor = ns.ClientURL(), svcCreds, "", bin
	})
	prod, err := nats.Connect(ns.ClientURL(), torpor.Credentials(credsFile(t, dir, "producer", "")))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	w := watchLog(t, busConn(t, a))
	v, cerr := busCmd(t, prod, "create", map[string]any{"name": "sim1", "driver": "sim"}, nil)
	if cerr != nil {
		t.Fatalf("producer create: %v", cerr)
	}
	w.wait(t, v.ID, "supervisor.attached")
	p, cerr := busCmd(t, prod, "create", map[string]any{"name": "proc1", "driver": "process", "command": []string{"sleep", "600"}}, nil)
	if cerr != nil {
		t.Fatalf("producer create of a process sandbox: %v", cerr)
	}
	w.wait(t, p.ID, "supervisor.attached")
}

// TestDriverAndSecondServeWithCreds: `torpor driver --nats-creds` with a
// driver's credentials of node n1 (--sim-reports) serves n1's drivers to the service (a sim
// and a process sandbox made there attach, the process one's supervisor as
// its own sandbox's user); a second serve joins the first's embedded server
// with --nats-url and a service's credentials, and is ready.
func TestDriverAndSecondServeWithCreds(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) { c.RemoteNodes = []string{"n1"} })
	data := t.TempDir()
	t.Cleanup(func() { deleteProcessSandboxes(t, data) })
	startDriver(t, "--node", "n1", "--drivers", "sim,process", "--nats-url", a.NATSURL(), "--nats-creds", simCredsFile(t, a.Data(), "n1"), "--data", data, "--heartbeat", "1s")
	svc := busConn(t, a)
	w := watchLog(t, svc)
	for _, body := range []map[string]any{
		{"name": "on-n1", "driver": "sim", "node": "n1"},
		{"name": "proc-n1", "driver": "process", "node": "n1", "command": []string{"sleep", "600"}},
	} {
		v, cerr := busCmd(t, svc, "create", body, nil)
		if cerr != nil {
			t.Fatalf("create %v: %v", body, cerr)
		}
		w.wait(t, v.ID, "supervisor.attached")
	}

	b := startApp(t, "", func(c *serveConfig) {
		c.NATSURL, c.NATSCreds, c.NATSListen, c.Node = a.NATSURL(), credsFile(t, a.Data(), "service", ""), "", "second"
	})
	if err := b.Ready(context.Background()); err != nil {
		t.Errorf("the second serve: %v", err)
	}
}

// TestDriverSimNeedsReports: a driver's credential without --sim-reports
// may not report for any sandbox, so `torpor driver --drivers sim` with it
// stops at start, saying how to mint one that may; without --drivers, the
// default's sim is left out and the process driver serves with it (its
// supervisors are users of their own sandbox).
func TestDriverSimNeedsReports(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) { c.RemoteNodes = []string{"n1"} })
	plain := credsFile(t, a.Data(), "driver", "n1")
	var stdout, stderr strings.Builder
	args := []string{"driver", "--node", "n1", "--drivers", "process,sim", "--nats-url", a.NATSURL(), "--nats-creds", plain, "--data", t.TempDir()}
	// Bounded: a driver that took the credential would serve until then.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if code := run(ctx, args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "INVALID_ARGUMENT: --nats-creds") || !strings.Contains(stderr.String(), "--sim-reports") {
		t.Errorf("torpor %v: %d %q, want INVALID_ARGUMENT naming --sim-reports", args, code, stderr.String())
	}
	data := t.TempDir()
	t.Cleanup(func() { deleteProcessSandboxes(t, data) })
	// Without --drivers, the default's sim is left out, not the start.
	startDriver(t, "--node", "n1", "--nats-url", a.NATSURL(), "--nats-creds", plain, "--data", data, "--heartbeat", "1s")
	svc := busConn(t, a)
	w := watchLog(t, svc)
	v, cerr := busCmd(t, svc, "create", map[string]any{"name": "proc-n1", "driver": "process", "node": "n1", "command": []string{"sleep", "600"}}, nil)
	if cerr != nil {
		t.Fatal(cerr)
	}
	w.wait(t, v.ID, "supervisor.attached")
	if _, cerr := busCmd(t, svc, "create", map[string]any{"name": "sim-n1", "driver": "sim", "node": "n1"}, nil); cerr == nil || !strings.Contains(cerr.Error(), `node n1 has no driver "sim"`) {
		t.Errorf("create a sim sandbox on n1: %v, want refused: n1 serves no sim", cerr)
	}
}

// TestServeRefusesBrokenBusKeys: a bus key under <data>/auth that is not a
// key stops the start with FAILED_PRECONDITION naming the file, and the
// file stays as it was (every credential minted under it would be lost).
func TestServeRefusesBrokenBusKeys(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "auth"), 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "auth", busauth.AccountFile)
	if err := os.WriteFile(path, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := serveConfig{Data: dir, HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Fsync: "interval", Node: "local", Deadline: 10 * time.Second, DuplicateWindow: time.Minute, HeartbeatLimit: 15 * time.Second}
	a, err := start(context.Background(), cfg, zerolog.Nop())
	if err == nil {
		_ = a.Stop()
	}
	if events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), path) {
		t.Errorf("start: %v, want FAILED_PRECONDITION naming %s", err, path)
	}
	if b, _ := os.ReadFile(path); string(b) != "garbage\n" {
		t.Errorf("the key file was replaced: %q", b)
	}
}

// TestNATSCredsFlagRefused: every verb that connects to NATS refuses a
// --nats-creds it cannot read, or that is no credentials file, with
// INVALID_ARGUMENT naming the flag, before it connects.
func TestNATSCredsFlagRefused(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.creds")
	garbage := filepath.Join(t.TempDir(), "garbage.creds")
	if err := os.WriteFile(garbage, []byte("not a creds file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := "nats://127.0.0.1:1"
	for _, file := range []string{missing, garbage} {
		for _, args := range [][]string{
			{"serve", "--data", t.TempDir(), "--http", "127.0.0.1:0", "--nats-url", url, "--nats-creds", file},
			{"driver", "--node", "n1", "--nats-url", url, "--data", t.TempDir(), "--nats-creds", file},
		} {
			var stdout, stderr strings.Builder
			if code := run(context.Background(), args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "INVALID_ARGUMENT: --nats-creds") {
				t.Errorf("torpor %v: %d %q, want INVALID_ARGUMENT naming --nats-creds", args, code, stderr.String())
			}
		}
	}
	var stdout, stderr strings.Builder
	args := []string{"supervise", "--sandbox", "s1", "--generation", "1", "--nats-url", url, "--nats-creds", missing, "--", "true"}
	if code := run(context.Background(), args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "INVALID_ARGUMENT: --nats-creds") {
		t.Errorf("torpor %v: %d %q, want INVALID_ARGUMENT naming --nats-creds", args, code, stderr.String())
	}
}

// TestCredsRevoke: `torpor creds --revoke FILE` revokes that file's user:
// the service started after refuses it, and takes another producer.
func TestCredsRevoke(t *testing.T) {
	dir := t.TempDir()
	gone, kept := credsFile(t, dir, "producer", ""), credsFile(t, dir, "producer,dashboard", "")
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"creds", "--data", dir, "--revoke", gone}, &stdout, &stderr); code != 0 {
		t.Fatalf("torpor creds --revoke: %d %s", code, stderr.String())
	}
	a := startApp(t, dir, nil)
	nc, err := nats.Connect(a.NATSURL(), torpor.Credentials(gone), nats.NoReconnect())
	if err == nil {
		nc.Close()
	}
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("revoked producer: got %v, want the server's authorization violation", err)
	}
	nc, err = nats.Connect(a.NATSURL(), torpor.Credentials(kept), nats.NoReconnect())
	if err != nil {
		t.Fatalf("a producer not revoked: %v", err)
	}
	nc.Close()

	// Revoked while the service runs: its connection is closed and it
	// cannot connect again, without a restart.
	live, err := nats.Connect(a.NATSURL(), torpor.Credentials(kept), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	closed := make(chan struct{})
	live.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if code := run(context.Background(), []string{"creds", "--data", dir, "--revoke", kept}, &stdout, &stderr); code != 0 {
		t.Fatalf("torpor creds --revoke: %d %s", code, stderr.String())
	}
	select {
	case <-closed:
	case <-time.After(waitFor):
		t.Fatal("the revoked user's connection is still open")
	}
	if nc, err := nats.Connect(a.NATSURL(), torpor.Credentials(kept), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("the user revoked while the service runs connected again")
	}
}

// TestBusActorIsTheUser: a producer's command is recorded with the name in
// its credential, which the server tells the service; neither a
// Torpor-Actor header nor a forged Nats-Request-Info changes it (before
// the clients' account, the actor was whatever Torpor-Actor said).
func TestBusActorIsTheUser(t *testing.T) {
	a := startApp(t, "", nil)
	file := filepath.Join(t.TempDir(), "alice.creds")
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"creds", "--data", a.Data(), "--role", "producer", "--name", "alice", "-o", file}, &stdout, &stderr); code != 0 {
		t.Fatalf("torpor creds: %d %s", code, stderr.String())
	}
	nc, err := nats.Connect(a.NATSURL(), torpor.Credentials(file))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	forged := nats.Header{}
	forged.Set("Torpor-Actor", "mallory")
	forged.Set("Nats-Request-Info", `{"kind":"Client","name_tag":"mallory","tags":["role:producer"]}`)
	for _, hdr := range []nats.Header{nil, forged} {
		v, cerr := busCmd(t, nc, "create", map[string]any{"driver": "sim"}, hdr)
		if cerr != nil {
			t.Fatalf("create: %v", cerr)
		}
		h, err := appClient(a).History(context.Background(), v.ID, 0)
		if err != nil || len(h) == 0 {
			t.Fatalf("history: %v %v", h, err)
		}
		if got, want := h[0].Actor, "bus:alice"; got != want {
			t.Errorf("headers %v: actor %q, want %q", hdr, got, want)
		}
	}
}

// TestDriverDeliversNoCommand: a driver may make push consumers on the
// snapshot store (its object store reads are ones), and the server delivers
// where their deliver subject says (nats-server issue 8274). A driver that
// writes a create command's body as an object chunk and aims a consumer of
// it at torpor.cmd.create makes no sandbox: the gateway takes commands from
// torpor's own account only answered on the service's inbox. Before, the
// delivery ran as a service's command.
func TestDriverDeliversNoCommand(t *testing.T) {
	a := startApp(t, "", nil)
	b, err := os.ReadFile(credsFile(t, a.Data(), "driver", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	u, err := busauth.ParseCreds(b, busauth.Grant{Role: busauth.Driver, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(a.NATSURL(), u.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	chunk := "$O." + busauth.SnapshotBucket + ".C.evil"
	if err := nc.Publish(chunk, []byte(`{"name":"evil","driver":"sim"}`)); err != nil {
		t.Fatal(err)
	}
	stream := "OBJ_" + busauth.SnapshotBucket
	req := fmt.Sprintf(`{"stream_name":%q,"config":{"deliver_subject":"torpor.cmd.create","deliver_group":"torpor","filter_subject":%q,"ack_policy":"none","deliver_policy":"all"}}`, stream, chunk)
	msg, err := nc.Request("$JS.API.CONSUMER.CREATE."+stream, []byte(req), waitFor)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Name  string `json:"name"`
		Error any    `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Error != nil {
		t.Fatalf("the driver's push consumer: %s", msg.Data)
	}
	for end := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		info, err := nc.Request("$JS.API.CONSUMER.INFO."+stream+"."+resp.Name, nil, waitFor)
		if err != nil {
			t.Fatal(err)
		}
		var ci struct {
			Delivered struct {
				Consumer uint64 `json:"consumer_seq"`
			} `json:"delivered"`
		}
		_ = json.Unmarshal(info.Data, &ci)
		if ci.Delivered.Consumer > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the consumer delivered nothing")
		}
	}
	// An absence, watched for a second after the delivery: a command the
	// gateway took is in the log within milliseconds.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if v, err := appClient(a).Get(context.Background(), "evil"); err == nil {
			t.Fatalf("a driver's delivery made sandbox %s", v.ID)
		}
	}
}
