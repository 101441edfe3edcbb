package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/busauth"
)

// streamReplicas is the replicas of every stream of the account the user
// of creds is in.
func streamReplicas(t *testing.T, url, creds string) map[string]int {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	l := js.ListStreams(context.Background())
	for info := range l.Info() {
		out[info.Config.Name] = info.Config.Replicas
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReplicas: on a three-server NATS cluster, --replicas 3 gives the log,
// every bucket, the object store and the clients' copies three replicas; a
// bus whose streams have fewer refuses --replicas 3 (saying how to raise
// them) until --raise-replicas raises them all; a start never lowers them
// (--replicas 1 is refused) and --replicas 0 takes what they have. The
// embedded server, one server, refuses --replicas 3.
func TestReplicas(t *testing.T) {
	c := newCluster(t, 0, 0, nil, onNATSCluster(3))
	start := func(replicas int, raise bool) (*Node, error) {
		cfg := testConfig(t, "ctl")
		cfg.NATSURL, cfg.NATSCreds, cfg.NATSListen, cfg.Replicas, cfg.RaiseReplicas = c.url(), c.service, "", replicas, raise
		cfg.Data = t.TempDir()
		if err := os.CopyFS(filepath.Join(cfg.Data, "auth"), os.DirFS(c.authDir)); err != nil {
			t.Fatal(err)
		}
		n, err := Start(context.Background(), cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
		if err == nil {
			t.Cleanup(func() { _ = n.Stop() })
		}
		return n, err
	}
	clients := c.creds("clients", busauth.Grant{Role: busauth.ClientsService})
	all := func(want int) {
		t.Helper()
		got := streamReplicas(t, c.url(), c.service)
		for name, r := range streamReplicas(t, c.url(), clients) {
			got["clients:"+name] = r
		}
		for _, name := range []string{"TORPOR_EVENTS", "KV_torpor_phases", "KV_torpor_positions", "KV_torpor_names", "KV_torpor_config", "KV_torpor_tokens", "OBJ_torpor_snapshots", "clients:TORPOR_EVENTS", "clients:KV_torpor_phases"} {
			if _, ok := got[name]; !ok {
				t.Errorf("no stream %s (streams: %v)", name, got)
			}
		}
		for name, r := range got {
			if r != want {
				t.Errorf("%s: R%d, want R%d", name, r, want)
			}
		}
	}
	n, err := start(1, false)
	if err != nil {
		t.Fatal(err)
	}
	_ = n.Stop()
	all(1)
	if _, err := start(3, false); events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "--raise-replicas") {
		t.Fatalf("--replicas 3 on R1 streams: %v, want FAILED_PRECONDITION saying --raise-replicas", err)
	}
	all(1) // the refused start changed nothing
	n, err = start(3, true)
	if err != nil {
		t.Fatal(err)
	}
	if n.Replicas() != 3 {
		t.Fatalf("replicas %d, want 3", n.Replicas())
	}
	_ = n.Stop()
	all(3)
	if _, err := start(1, false); events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "never lowers") {
		t.Fatalf("--replicas 1 on R3 streams: %v, want FAILED_PRECONDITION", err)
	}
	n, err = start(0, false)
	if err != nil {
		t.Fatal(err)
	}
	if n.Replicas() != 3 {
		t.Fatalf("--replicas 0 on R3 streams: replicas %d, want 3", n.Replicas())
	}
	all(3)

	cfg := testConfig(t, "solo")
	cfg.Replicas = 3
	if _, err := Start(context.Background(), cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)); events.CodeOf(err) != events.CodeInvalidArgument {
		t.Fatalf("--replicas 3 on the embedded server: %v, want INVALID_ARGUMENT", err)
	}
}
