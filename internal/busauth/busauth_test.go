package busauth_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/internal/embedded"
)

// bus is a server run with an Auth, and the service's connection to it
// with what torpor keeps there: the stream, the phase view, the config
// bucket with its secret, the snapshot store, a command responder in the
// queue group torpor and a report responder.
type bus struct {
	auth *busauth.Auth
	ns   *server.Server
	js   jetstream.JetStream
}

const (
	sandboxA = "0b8a7a4e-5c44-4b9e-9d8e-2f1d3c4b5a6f"
	sandboxB = "7f6e5d4c-3b2a-4190-8a7b-6c5d4e3f2a1b"
	secret   = "the-credential-secret-0123456789"
)

func startBus(t *testing.T) *bus {
	t.Helper()
	return startBusWith(t, busauth.NoLimits)
}

// startBusWith is startBus with the accounts' limits lim.
func startBusWith(t *testing.T, lim busauth.Limits) *bus {
	t.Helper()
	dir := t.TempDir()
	a, err := busauth.Open(filepath.Join(dir, "auth"), lim)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := embedded.Start(embedded.Config{Data: dir, Listen: "127.0.0.1:0", Operator: a.OperatorJWT, Accounts: a.Accounts(), SystemAccount: a.SystemKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	b := &bus{auth: a, ns: ns}
	svc := b.conn(t, nil, busauth.Grant{Role: busauth.Service})
	b.js, _ = jetstream.New(svc)
	ctx := t.Context()
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: busauth.EventStream, Subjects: []string{"torpor.sandbox.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(ctx, "torpor.sandbox."+sandboxA, []byte(`{"type":"sandbox.created"}`)); err != nil {
		t.Fatal(err)
	}
	phases, err := b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: busauth.PhaseBucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := phases.Put(ctx, sandboxA, []byte(`{"phase":"running"}`)); err != nil {
		t.Fatal(err)
	}
	config, err := b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "torpor_config"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Put(ctx, "credential_secret", []byte(secret)); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.QueueSubscribe("torpor.cmd.>", "torpor", func(m *nats.Msg) { _ = m.Respond([]byte("service: " + m.Subject)) }); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.QueueSubscribe("torpor.supervisor.*", "torpor", func(m *nats.Msg) { _ = m.Respond([]byte("taken: " + m.Subject)) }); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	b.copies(t)
	return b
}

// copies makes the clients' account's copies and waits until the view's
// copy holds sandbox A's view.
func (b *bus) copies(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	cjs, _ := jetstream.New(b.conn(t, nil, busauth.Grant{Role: busauth.ClientsService}))
	if err := busauth.Copies(ctx, cjs, busauth.CopyLimits{Events: 1 << 20, Phases: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	kv, err := cjs.KeyValue(ctx, busauth.PhaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := kv.Get(ctx, sandboxA); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the clients' copy of the view: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// conn connects as a user holding grants; the server's refusals of its
// publications and subscriptions go to errs when it is not nil.
func (b *bus) conn(t *testing.T, errs chan<- error, grants ...busauth.Grant) *nats.Conn {
	t.Helper()
	u, err := b.auth.User("test", time.Hour, grants...)
	if err != nil {
		t.Fatal(err)
	}
	opts := append(u.Options(), nats.InProcessServer(b.ns), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errs != nil {
			select {
			case errs <- err:
			default:
			}
		}
	}))
	nc, err := nats.Connect("", opts...)
	if err != nil {
		t.Fatalf("connect as %v: %v", grants, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// action is one thing a role must not do: a publication or a subscription
// the server must refuse, and (where it would leave a trace) a check that
// it left none.
type action struct {
	name    string
	sub     bool
	queue   string
	subject string
	unmoved func(t *testing.T, b *bus)
}

func actions() []action {
	return []action{
		{name: "publish an event", subject: "torpor.sandbox." + sandboxB, unmoved: func(t *testing.T, b *bus) {
			s, _ := b.js.Stream(t.Context(), busauth.EventStream)
			if _, err := s.GetLastMsgForSubject(t.Context(), "torpor.sandbox."+sandboxB); err == nil {
				t.Error("the forged event is in the stream")
			}
		}},
		{name: "delete the stream", subject: "$JS.API.STREAM.DELETE." + busauth.EventStream, unmoved: func(t *testing.T, b *bus) {
			if _, err := b.js.Stream(t.Context(), busauth.EventStream); err != nil {
				t.Errorf("the stream: %v", err)
			}
		}},
		{name: "purge the stream", subject: "$JS.API.STREAM.PURGE." + busauth.EventStream},
		{name: "read torpor_config (direct get)", subject: "$JS.API.DIRECT.GET.KV_torpor_config.$KV.torpor_config.credential_secret"},
		{name: "read torpor_config (consumer)", subject: "$JS.API.CONSUMER.CREATE.KV_torpor_config"},
		{name: "read torpor_config (its writes)", sub: true, subject: "$KV.torpor_config.>"},
		{name: "read the service's answers", sub: true, subject: "_TORPOR_SVC.>"},
		{name: "join the queue group torpor (commands)", sub: true, queue: "torpor", subject: "torpor.cmd.>"},
		{name: "join the queue group torpor (reports)", sub: true, queue: "torpor", subject: "torpor.supervisor.*"},
		{name: "call another node's driver", subject: "torpor.driver.n2.start"},
		{name: "serve another node's driver", sub: true, subject: "torpor.driver.n2.>"},
		// Issue 29: whether a node can restore a snapshot is the service's
		// question to that node's driver alone.
		{name: "ask another node whether it can restore", subject: "torpor.driver.n2.check"},
		{name: "answer for another node whether it can restore", sub: true, subject: "torpor.driver.n2.check"},
		// Issue 29: so is the wait for a node's export ahead.
		{name: "ask another node for its export ahead", subject: "torpor.driver.n2.await_export"},
		{name: "answer for another node's export ahead", sub: true, subject: "torpor.driver.n2.await_export"},
		{name: "write the view", subject: "$KV." + busauth.PhaseBucket + "." + sandboxA, unmoved: func(t *testing.T, b *bus) {
			kv, _ := b.js.KeyValue(t.Context(), busauth.PhaseBucket)
			e, err := kv.Get(t.Context(), sandboxA)
			if err != nil || string(e.Value()) != `{"phase":"running"}` {
				t.Errorf("the view: %v %v", e, err)
			}
		}},
		{name: "make the snapshot store", subject: "$JS.API.STREAM.CREATE.OBJ_" + busauth.SnapshotBucket},
		{name: "change the snapshot store", subject: "$JS.API.STREAM.UPDATE.OBJ_" + busauth.SnapshotBucket},
		{name: "make a durable consumer", subject: "$JS.API.CONSUMER.DURABLE.CREATE." + busauth.EventStream + ".mine"},
		// Speak for a sandbox: its own (only its supervisor's), another's
		// (sandbox B, on no driver's node).
		{name: "report for sandbox A", subject: "torpor.supervisor." + sandboxA},
		{name: "report for sandbox B", subject: "torpor.supervisor." + sandboxB},
		// Issue 23, row 8: the names are the service's to write.
		{name: "purge torpor_names", subject: "$JS.API.STREAM.PURGE.KV_torpor_names"},
		{name: "point a name elsewhere", subject: "$KV.torpor_names.kept"},
	}
}

// TestRolesRefused: for every role but the service, each thing it must not
// do is refused by the nats-server itself (a permissions violation) and
// leaves no trace.
func TestRolesRefused(t *testing.T) {
	b := startBus(t)
	roles := []struct {
		name   string
		grants []busauth.Grant
		// may are the actions this role is granted (not refused).
		may []string
	}{
		{"producer", []busauth.Grant{{Role: busauth.Producer}}, nil},
		{"dashboard", []busauth.Grant{{Role: busauth.Dashboard}}, nil},
		{"producer+dashboard", []busauth.Grant{{Role: busauth.Producer}, {Role: busauth.Dashboard}}, nil},
		{"driver n1", []busauth.Grant{{Role: busauth.Driver, Node: "n1"}}, nil},
		// The opt-in of a sim's node reports, and widens nothing else.
		{"driver n1 with sim reports", []busauth.Grant{{Role: busauth.Driver, Node: "n1", SimReports: true}}, []string{"report for sandbox A", "report for sandbox B"}},
		{"supervisor of A", []busauth.Grant{{Role: busauth.Supervisor, Sandbox: sandboxA}}, []string{"report for sandbox A"}},
	}
	for _, r := range roles {
		for _, a := range actions() {
			if slices.Contains(r.may, a.name) {
				continue
			}
			t.Run(r.name+"/"+a.name, func(t *testing.T) {
				errs := make(chan error, 4)
				nc := b.conn(t, errs, r.grants...)
				var err error
				if a.sub {
					_, err = nc.QueueSubscribe(a.subject, a.queue, func(*nats.Msg) {})
				} else {
					err = nc.Publish(a.subject, []byte(`{"type":"sandbox.created"}`))
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				wantRefused(t, errs, a.subject)
				if a.unmoved != nil {
					a.unmoved(t, b)
				}
			})
		}
	}
}

// TestSupervisorSpeaksOnlyForItsSandbox: a supervisor's credential reports
// for its own sandbox, and the server refuses its report for another.
func TestSupervisorSpeaksOnlyForItsSandbox(t *testing.T) {
	b := startBus(t)
	errs := make(chan error, 4)
	nc := b.conn(t, errs, busauth.Grant{Role: busauth.Supervisor, Sandbox: sandboxA})
	msg, err := nc.Request("torpor.supervisor."+sandboxA, []byte("{}"), 5*time.Second)
	if err != nil {
		t.Fatalf("own report: %v", err)
	}
	if got, want := string(msg.Data), "taken: torpor.supervisor."+sandboxA; got != want {
		t.Errorf("own report answered %q, want %q", got, want)
	}
	if err := nc.Publish("torpor.supervisor."+sandboxB, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, errs, "torpor.supervisor."+sandboxB)
}

// wantRefused waits for the server's permissions violation naming subject.
func wantRefused(t *testing.T, errs <-chan error, subject string) {
	t.Helper()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") || !strings.Contains(err.Error(), subject) {
			t.Errorf("got %v, want a permissions violation for %s", err, subject)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("%s: not refused", subject)
	}
}

// TestAnonymousRefused: a client without a credential does not connect,
// nor does one with a user of another operator.
func TestAnonymousRefused(t *testing.T) {
	b := startBus(t)
	nc, err := nats.Connect(b.ns.ClientURL(), nats.NoReconnect())
	if err == nil {
		nc.Close()
	}
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("anonymous client: got %v, want the server's authorization violation", err)
	}
	other, err := busauth.Open(filepath.Join(t.TempDir(), "auth"), busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	u, err := other.User("stranger", time.Hour, busauth.Grant{Role: busauth.Service})
	if err != nil {
		t.Fatal(err)
	}
	nc, err = nats.Connect(b.ns.ClientURL(), append(u.Options(), nats.NoReconnect())...)
	if err == nil {
		nc.Close()
	}
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("user of another operator: got %v, want the server's authorization violation", err)
	}
}

// TestRolesAllowed: each role does what it is for.
func TestRolesAllowed(t *testing.T) {
	b := startBus(t)
	ctx := t.Context()
	t.Run("producer sends a command", func(t *testing.T) {
		nc := b.conn(t, nil, busauth.Grant{Role: busauth.Producer})
		msg, err := nc.Request("torpor.cmd.create", []byte("{}"), 5*time.Second)
		if err != nil || string(msg.Data) != "service: torpor.cmd.create" {
			t.Errorf("got %v %v, want the service's answer", msg, err)
		}
	})
	t.Run("dashboard reads the view and the stream", func(t *testing.T) {
		nc := b.conn(t, nil, busauth.Grant{Role: busauth.Dashboard})
		js, _ := jetstream.New(nc)
		kv, err := js.KeyValue(ctx, busauth.PhaseBucket)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, sandboxA)
		if err != nil || string(e.Value()) != `{"phase":"running"}` {
			t.Errorf("get: %v %v", e, err)
		}
		w, err := kv.WatchAll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = w.Stop() }()
		if got := <-w.Updates(); got == nil || got.Key() != sandboxA {
			t.Errorf("watch: first update %v, want %s", got, sandboxA)
		}
		s, err := js.Stream(ctx, busauth.EventStream)
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil || m.Subject() != "torpor.sandbox."+sandboxA {
			t.Errorf("ordered read: %v %v", m, err)
		}
		if _, err := s.GetLastMsgForSubject(ctx, "torpor.sandbox."+sandboxA); err != nil {
			t.Errorf("get last: %v", err)
		}
	})
	t.Run("driver serves its node", func(t *testing.T) {
		drv := b.conn(t, nil, busauth.Grant{Role: busauth.Driver, Node: "n1"})
		if _, err := drv.QueueSubscribe("torpor.driver.n1.>", "driver", func(m *nats.Msg) { _ = m.Respond([]byte("started")) }); err != nil {
			t.Fatal(err)
		}
		// As remote.Serve has it: a catch-all for unknown operations
		// gets every request too, and stays silent on known ones.
		if _, err := drv.QueueSubscribe("torpor.driver.n1.>", "catch-all", func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		if err := drv.Flush(); err != nil {
			t.Fatal(err)
		}
		svc := b.conn(t, nil, busauth.Grant{Role: busauth.Service})
		msg, err := svc.Request("torpor.driver.n1.start", []byte("{}"), 5*time.Second)
		if err != nil || string(msg.Data) != "started" {
			t.Errorf("got %v %v, want the driver's answer", msg, err)
		}
	})
	t.Run("driver answers its node's check", func(t *testing.T) {
		// Issue 29: the service asks the target node's driver, before a
		// resume consumes anything, whether it can restore the snapshot.
		drv := b.conn(t, nil, busauth.Grant{Role: busauth.Driver, Node: "n1"})
		if _, err := drv.QueueSubscribe("torpor.driver.n1.check", "torpor-driver", func(m *nats.Msg) { _ = m.Respond([]byte("can restore")) }); err != nil {
			t.Fatal(err)
		}
		if err := drv.Flush(); err != nil {
			t.Fatal(err)
		}
		svc := b.conn(t, nil, busauth.Grant{Role: busauth.Service})
		msg, err := svc.Request("torpor.driver.n1.check", []byte("{}"), 5*time.Second)
		if err != nil || string(msg.Data) != "can restore" {
			t.Errorf("got %v %v, want the driver's answer", msg, err)
		}
	})
	t.Run("driver with sim reports reports", func(t *testing.T) {
		// `torpor driver --drivers sim` on a node of its own: the sim is
		// its sandboxes' supervisor.
		drv := b.conn(t, nil, busauth.Grant{Role: busauth.Driver, Node: "n1", SimReports: true})
		msg, err := drv.Request("torpor.supervisor."+sandboxA, []byte("{}"), 5*time.Second)
		if err != nil || string(msg.Data) != "taken: torpor.supervisor."+sandboxA {
			t.Errorf("got %v %v, want the service's answer", msg, err)
		}
	})
	t.Run("driver moves a snapshot", func(t *testing.T) {
		drv := b.conn(t, nil, busauth.Grant{Role: busauth.Driver, Node: "n1"})
		js, _ := jetstream.New(drv)
		if _, err := b.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: busauth.SnapshotBucket}); err != nil {
			t.Fatal(err) // the service makes it
		}
		obj, err := js.ObjectStore(ctx, busauth.SnapshotBucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := obj.PutBytes(ctx, sandboxA+"/s1", []byte("ram")); err != nil {
			t.Fatal(err)
		}
		got, err := obj.GetBytes(ctx, sandboxA+"/s1")
		if err != nil || string(got) != "ram" {
			t.Errorf("get: %q %v", got, err)
		}
		if err := obj.Delete(ctx, sandboxA+"/s1"); err != nil {
			t.Errorf("delete: %v", err)
		}
	})
}

// TestOpenKeepsKeys: the keys are made once, mode 0600, and found again;
// a key file that is not a seed of its kind stops Open and stays as it is.
func TestOpenKeepsKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	a, err := busauth.Open(dir, busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{busauth.OperatorFile, busauth.AccountFile, busauth.SystemFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o600 {
			t.Errorf("%s: mode %o, want 600", f, got)
		}
	}
	again, err := busauth.Open(dir, busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	if again.AccountKey != a.AccountKey || again.SystemKey != a.SystemKey {
		t.Errorf("keys changed on the second open")
	}
	// A user minted under the first Open is a user of the second's account.
	for _, tc := range []struct {
		name, file string
		content    []byte
		want       string
	}{
		{"garbage", busauth.AccountFile, []byte("not a seed\n"), "not an nkey seed"},
		{"wrong kind", busauth.SystemFile, must(os.ReadFile(filepath.Join(dir, busauth.OperatorFile))), "wrong kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := filepath.Join(t.TempDir(), "auth")
			if _, err := busauth.Open(d, busauth.NoLimits); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(d, tc.file)
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := busauth.Open(d, busauth.NoLimits)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, tc.content) {
				t.Errorf("the key file was replaced")
			}
		})
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestCredsFile: the credentials file of a user is one nats.go connects
// with.
func TestCredsFile(t *testing.T) {
	b := startBus(t)
	u, err := b.auth.User("file", time.Hour, busauth.Grant{Role: busauth.Producer})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := u.Creds()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "p.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	inbox, err := busauth.CredsInbox(creds)
	if err != nil || inbox != u.Inbox {
		t.Fatalf("the file's inbox: %q %v, want %q", inbox, err, u.Inbox)
	}
	nc, err := nats.Connect("", nats.InProcessServer(b.ns), nats.UserCredentials(path), nats.CustomInboxPrefix(inbox))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := nc.RequestWithContext(ctx, "torpor.cmd.get", nil); err != nil {
		t.Errorf("request with the file's user: %v", err)
	}
}

// TestParseRoles: the --role lists torpor creds takes.
func TestParseRoles(t *testing.T) {
	for _, tc := range []struct {
		roles []string
		node  string
		sim   bool
		want  string // an error saying this; empty: none
	}{
		{[]string{"producer", "dashboard"}, "", false, ""},
		{[]string{"driver"}, "n1", false, ""},
		{[]string{"driver"}, "n1", true, ""},
		{[]string{"driver"}, "", false, "no node"},
		{[]string{"driver"}, "a.b", false, "one subject token"},
		{[]string{"producer"}, "n1", false, "only a driver"},
		{[]string{"producer"}, "", true, "--sim-reports: only a driver"},
		{[]string{"supervisor"}, "", false, "minted by the service"},
		{[]string{"root"}, "", false, "unknown role"},
		{nil, "", false, "no role"},
	} {
		grants, err := busauth.ParseRoles(tc.roles, tc.node, tc.sim)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%v --node %q --sim-reports=%t: got %v, want %q", tc.roles, tc.node, tc.sim, err, tc.want)
		}
		for _, g := range grants {
			if g.SimReports != (tc.sim && g.Role == busauth.Driver) {
				t.Errorf("%v --node %q --sim-reports=%t: grant %+v", tc.roles, tc.node, tc.sim, g)
			}
		}
	}
}

// TestRevoke: a revoked user is refused by a server started after the
// revocation, another user of the account is not; the revocation is kept
// under the auth directory, and a garbled list stops Open.
func TestRevoke(t *testing.T) {
	data := t.TempDir()
	dir := filepath.Join(data, "auth")
	a, err := busauth.Open(dir, busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := a.User("gone", 0, busauth.Grant{Role: busauth.Producer})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := a.User("kept", 0, busauth.Grant{Role: busauth.Producer})
	if err != nil {
		t.Fatal(err)
	}
	creds, _ := gone.Creds()
	if _, err := a.Revoke(creds); err != nil {
		t.Fatal(err)
	}
	other, err := busauth.Open(filepath.Join(t.TempDir(), "auth"), busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := other.User("foreign", 0, busauth.Grant{Role: busauth.Producer})
	fcreds, _ := foreign.Creds()
	if _, err := a.Revoke(fcreds); err == nil || !strings.Contains(err.Error(), "not a user of this bus") {
		t.Errorf("revoke a user of another bus: %v", err)
	}

	again, err := busauth.Open(dir, busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := embedded.Start(embedded.Config{Data: data, Listen: "127.0.0.1:0", Operator: again.OperatorJWT, Accounts: again.Accounts(), SystemAccount: again.SystemKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL(), append(gone.Options(), nats.NoReconnect())...)
	if err == nil {
		nc.Close()
	}
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("revoked user: got %v, want the server's authorization violation", err)
	}
	nc, err = nats.Connect(ns.ClientURL(), append(kept.Options(), nats.NoReconnect())...)
	if err != nil {
		t.Errorf("a user not revoked: %v", err)
	} else {
		nc.Close()
	}

	if err := os.WriteFile(filepath.Join(dir, busauth.RevokedFile), []byte("nonsense\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := busauth.Open(dir, busauth.NoLimits); err == nil || !strings.Contains(err.Error(), "revoked users") {
		t.Errorf("open with a garbled revocation list: %v", err)
	}
}

// TestClientsDeliverNowhere: a dashboard may make push consumers on its
// copies, and the server delivers wherever their deliver subject says,
// whatever the dashboard may publish (nats-server issue 8274). Aimed at
// torpor's secret, its view, its log and its command and report subjects,
// the deliveries land in the clients' account and reach none of them.
func TestClientsDeliverNowhere(t *testing.T) {
	b := startBus(t)
	ctx := t.Context()
	svc := b.conn(t, nil, busauth.Grant{Role: busauth.Service})
	// What reaches the service: a delivery comes through the commands'
	// import, and the server marks it as JetStream's, with no user, so
	// that the service can tell it from a producer's command (the gateway
	// refuses it).
	heard := make(chan string, 64)
	for _, subj := range []string{"torpor.cmd.>", "torpor.supervisor.>"} {
		if _, err := svc.Subscribe(subj, func(m *nats.Msg) {
			var info struct {
				Kind string   `json:"kind"`
				User string   `json:"user"`
				Tags []string `json:"tags"`
			}
			_ = json.Unmarshal([]byte(m.Header.Get("Nats-Request-Info")), &info)
			if info.Kind != "JetStream" || info.User != "" || len(info.Tags) > 0 {
				heard <- fmt.Sprintf("%s on %s (request info %q)", m.Subject, m.Sub.Subject, m.Header.Get("Nats-Request-Info"))
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	dash := b.conn(t, nil, busauth.Grant{Role: busauth.Dashboard})
	// A witness in the clients' account listens where the deliveries go
	// (a push consumer delivers only to a subject someone listens on).
	witness := b.conn(t, nil, busauth.Grant{Role: busauth.ClientsService})
	landed := make(chan string, 64)
	targets := []string{
		"$KV.torpor_config.credential_secret",
		"$KV." + busauth.PhaseBucket + "." + sandboxA,
		"torpor.sandbox." + sandboxB,
		"torpor.cmd.create",
		"torpor.supervisor." + sandboxA,
	}
	for _, target := range targets {
		if _, err := witness.Subscribe(target, func(m *nats.Msg) { landed <- m.Subject }); err != nil {
			t.Fatal(err)
		}
	}
	if err := witness.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, target := range targets {
		for _, stream := range []string{busauth.EventStream, "KV_" + busauth.PhaseBucket} {
			req := fmt.Sprintf(`{"stream_name":%q,"config":{"deliver_subject":%q,"ack_policy":"none","deliver_policy":"all"}}`, stream, target)
			msg, err := dash.Request("$JS.API.CONSUMER.CREATE."+stream, []byte(req), 5*time.Second)
			if err != nil {
				t.Fatalf("%s: %v", target, err)
			}
			var resp struct {
				Name  string `json:"name"`
				Error any    `json:"error"`
			}
			if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Error != nil {
				t.Fatalf("push consumer on %s delivering to %s: %s", stream, target, msg.Data)
			}
			// Each consumer delivered its messages before the checks.
			for deadline := time.Now().Add(5 * time.Second); ; {
				info, err := dash.Request("$JS.API.CONSUMER.INFO."+stream+"."+resp.Name, nil, 5*time.Second)
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
				if time.Now().After(deadline) {
					t.Fatalf("consumer %d on %s delivered nothing to %s", i, stream, target)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	config, err := b.js.KeyValue(ctx, "torpor_config")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := config.Get(ctx, "credential_secret"); err != nil || string(e.Value()) != secret || e.Revision() != 1 {
		t.Errorf("torpor_config's secret: %v %v, want it untouched", e, err)
	}
	phases, err := b.js.KeyValue(ctx, busauth.PhaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := phases.Get(ctx, sandboxA); err != nil || string(e.Value()) != `{"phase":"running"}` || e.Revision() != 1 {
		t.Errorf("the view: %v %v, want it untouched", e, err)
	}
	s, err := b.js.Stream(ctx, busauth.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, "torpor.sandbox."+sandboxB); err == nil {
		t.Error("a delivery is in the log")
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case subj := <-heard:
		t.Errorf("the service received a delivery it cannot tell from a client's: %s", subj)
	default:
	}
	if len(landed) == 0 {
		t.Error("no delivery reached the witness in the clients' account")
	}
}

// TestClientConsumersBounded: the clients' account holds at most
// ClientConsumers consumers, so a client cannot fill the server with
// them; the service's account is not bound by it.
func TestClientConsumersBounded(t *testing.T) {
	b := startBusWith(t, busauth.Limits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumers: -1, ClientConsumers: 3})
	ctx := t.Context()
	djs, _ := jetstream.New(b.conn(t, nil, busauth.Grant{Role: busauth.Dashboard}))
	s, err := djs.Stream(ctx, busauth.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		_, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if i < 3 && err != nil {
			t.Fatalf("consumer %d: %v", i+1, err)
		}
		if i == 3 && (err == nil || !strings.Contains(err.Error(), "maximum consumers")) {
			t.Errorf("consumer %d: %v, want the account's maximum consumers reached", i+1, err)
		}
	}
	ss, err := b.js.Stream(ctx, busauth.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := ss.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{}); err != nil {
			t.Errorf("the service's consumer %d: %v", i+1, err)
		}
	}
}

// TestClientInboxesApart: each client reads its answers on an inbox of its
// own; another client may not read it, nor the shared _INBOX (before,
// producers and dashboards shared _INBOX and read each other's answers).
func TestClientInboxesApart(t *testing.T) {
	b := startBus(t)
	alice, err := b.auth.User("alice", time.Hour, busauth.Grant{Role: busauth.Producer})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(alice.Inbox, busauth.DefaultInbox+"_") {
		t.Fatalf("alice's inbox %q: want one of her own", alice.Inbox)
	}
	for _, subject := range []string{alice.Inbox + ".>", busauth.DefaultInbox + ".>", ">"} {
		errs := make(chan error, 4)
		mallory := b.conn(t, errs, busauth.Grant{Role: busauth.Producer}, busauth.Grant{Role: busauth.Dashboard})
		if _, err := mallory.Subscribe(subject, func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		if err := mallory.Flush(); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, errs, subject)
	}
}

// TestCheckAskedByTheServiceOnly (issue 29): no role but the service asks
// node n1's driver whether it can restore a snapshot, or waits for its
// export ahead, and no driver but n1's answers either: the nats-server
// refuses the others.
func TestCheckAskedByTheServiceOnly(t *testing.T) {
	b := startBus(t)
	for _, subject := range []string{"torpor.driver.n1.check", "torpor.driver.n1.await_export"} {
		for _, tc := range []struct {
			name   string
			grants []busauth.Grant
			sub    bool
		}{
			{"producer asks", []busauth.Grant{{Role: busauth.Producer}}, false},
			{"dashboard asks", []busauth.Grant{{Role: busauth.Dashboard}}, false},
			{"supervisor asks", []busauth.Grant{{Role: busauth.Supervisor, Sandbox: sandboxA}}, false},
			{"driver n2 asks", []busauth.Grant{{Role: busauth.Driver, Node: "n2"}}, false},
			{"driver n2 answers", []busauth.Grant{{Role: busauth.Driver, Node: "n2"}}, true},
			{"producer answers", []busauth.Grant{{Role: busauth.Producer}}, true},
		} {
			t.Run(subject+"/"+tc.name, func(t *testing.T) {
				errs := make(chan error, 4)
				nc := b.conn(t, errs, tc.grants...)
				var err error
				if tc.sub {
					_, err = nc.QueueSubscribe(subject, "torpor-driver", func(*nats.Msg) {})
				} else {
					err = nc.Publish(subject, []byte(`{"driver":"vm","spec":{"sandbox_id":"a","node":"n1"},"ref":"r"}`))
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				wantRefused(t, errs, subject)
			})
		}
	}
}

// TestCredsReport: whether a credentials file's user may report for every
// sandbox, as `torpor driver --drivers sim` asks at start.
func TestCredsReport(t *testing.T) {
	a, err := busauth.Open(filepath.Join(t.TempDir(), "auth"), busauth.NoLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		grant busauth.Grant
		want  bool
	}{
		{"service", busauth.Grant{Role: busauth.Service}, true},
		{"driver", busauth.Grant{Role: busauth.Driver, Node: "n1"}, false},
		{"driver with sim reports", busauth.Grant{Role: busauth.Driver, Node: "n1", SimReports: true}, true},
		{"producer", busauth.Grant{Role: busauth.Producer}, false},
		{"supervisor of A", busauth.Grant{Role: busauth.Supervisor, Sandbox: sandboxA}, false},
	} {
		u, err := a.User(tc.name, time.Hour, tc.grant)
		if err != nil {
			t.Fatal(err)
		}
		creds, _ := u.Creds()
		got, err := busauth.CredsReport(creds)
		if err != nil || got != tc.want {
			t.Errorf("%s: got %t %v, want %t", tc.name, got, err, tc.want)
		}
	}
	if _, err := busauth.CredsReport([]byte("garbage")); err == nil {
		t.Error("garbage: no error")
	}
}
