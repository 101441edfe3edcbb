package embedded

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func stop(ns *server.Server) {
	ns.Shutdown()
	ns.WaitForShutdown()
}

// TestDataOutlivesTheServer: a server started again over the same data
// directory finds the streams of the one before, whether it listens or not,
// and keeps them under <data>/jetstream.
func TestDataOutlivesTheServer(t *testing.T) {
	data := t.TempDir()
	ns, err := Start(Config{Data: data})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Addr() != nil {
		t.Errorf("listening on %v without Listen", ns.Addr())
	}
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		stop(ns)
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "KEPT", Subjects: []string{"kept"}}); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	stop(ns)
	if _, err := os.Stat(filepath.Join(data, "jetstream")); err != nil {
		t.Errorf("the store is not under <data>/jetstream: %v", err)
	}

	ns, err = Start(Config{Data: data, Listen: "127.0.0.1:0", SyncAlways: true, Name: "again"})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(ns)
	if !strings.HasPrefix(ns.ClientURL(), "nats://127.0.0.1:") || strings.HasSuffix(ns.ClientURL(), ":0") {
		t.Errorf("client URL %s, want a random loopback port", ns.ClientURL())
	}
	nc, err = nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	if _, err := js.Stream(t.Context(), "KEPT"); err != nil {
		t.Errorf("stream of the first server: %v", err)
	}
}

// TestStartRefuses: a config the server cannot run with is an error, and
// starts nothing.
func TestStartRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no data", Config{}, "no data directory"},
		{"no port", Config{Data: t.TempDir(), Listen: "127.0.0.1"}, "listen"},
		{"bad port", Config{Data: t.TempDir(), Listen: "127.0.0.1:http"}, "bad port"},
		{"port out of range", Config{Data: t.TempDir(), Listen: "127.0.0.1:70000"}, "bad port"},
		{"accounts without an operator", Config{Data: t.TempDir(), Accounts: map[string]string{"A": "jwt"}}, "without an operator"},
		{"operator without its system account", Config{Data: t.TempDir(), Operator: "jwt", Accounts: map[string]string{"A": "jwt"}, SystemAccount: "S"}, "system account"},
		{"operator not a JWT", Config{Data: t.TempDir(), Operator: "not a jwt", Accounts: map[string]string{"S": "jwt"}, SystemAccount: "S"}, "operator"},
	} {
		ns, err := Start(tc.cfg)
		if err == nil {
			stop(ns)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
