package embedded

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestClusterReplicates: three servers laid out and started by LayCluster
// and StartCluster form one cluster with a JetStream meta leader; a stream
// made with three replicas through one server has a copy on each, and a
// message appended through one server is read through another.
func TestClusterReplicates(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	cfgs, err := LayCluster("embedded-test", dirs, Config{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, c := range cfgs {
		if c.Data != dirs[i] || c.Cluster != "embedded-test" || len(c.Routes) != 2 || seen[c.Listen] || seen[c.ClusterListen] || seen[c.Name] {
			t.Errorf("server %d: %+v, want its own directory, name, ports and the other two's routes", i, c)
		}
		for _, r := range c.Routes {
			if r == "nats-route://"+c.ClusterListen {
				t.Errorf("server %d routes to itself", i)
			}
		}
		seen[c.Listen], seen[c.ClusterListen], seen[c.Name] = true, true, true
	}
	cfgs, servers, err := StartCluster("embedded-test", dirs, Config{}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			stop(s)
		}
	})
	connect := func(url string) jetstream.JetStream {
		t.Helper()
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return js
	}
	first, last := connect(servers[0].ClientURL()), connect(servers[2].ClientURL())
	// The first R3 stream of a new cluster elects its raft group before it
	// answers: under -race beside other tests that took more than the
	// client's default 5 s (CI). What is checked is that it is made, not
	// how fast.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := first.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Publish(t.Context(), "r3", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || info.Cluster.Name != "embedded-test" || len(info.Cluster.Replicas) != 2 {
		t.Errorf("stream cluster %+v, want a leader and two replicas in embedded-test", info.Cluster)
	}
	there, err := last.Stream(t.Context(), "R3")
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := there.GetLastMsgForSubject(t.Context(), "r3"); err != nil || string(msg.Data) != "kept" {
		t.Errorf("read through the third server: %v, %v", msg, err)
	}
	if got, want := ClusterURL(cfgs), "nats://"+cfgs[0].Listen+",nats://"+cfgs[1].Listen+",nats://"+cfgs[2].Listen; got != want {
		t.Errorf("ClusterURL = %s, want %s", got, want)
	}
}

// TestStartSaysWhyAtOnce: a server whose port is taken fails its start at
// once, saying so, rather than after waiting to be ready; a cluster laid
// out again takes other ports.
func TestStartSaysWhyAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	began := time.Now()
	ns, err := Start(Config{Data: t.TempDir(), Listen: ln.Addr().String()})
	if err == nil {
		stop(ns)
	}
	if err == nil || !strings.Contains(err.Error(), "address already in use") || time.Since(began) > readyIn/2 {
		t.Errorf("start on a taken port: %v after %s, want the listener's error at once", err, time.Since(began))
	}
}
