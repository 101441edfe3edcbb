package node

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	torpor "github.com/torpor/torpor/sdk/go"
)

// testConfig is a node's config for a test: on random ports, short
// limits.
func testConfig(t *testing.T, name string) Config {
	return Config{Data: t.TempDir(), HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Fsync: "interval", Node: name,
		Deadline: 10 * time.Second, DuplicateWindow: time.Minute, HeartbeatLimit: 15 * time.Second}
}

func startNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Start(context.Background(), cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	if err != nil {
		t.Fatalf("start %s: %v", cfg.Node, err)
	}
	t.Cleanup(func() { _ = n.Stop() })
	return n
}

// TestThreeNodesInOneProcess: three nodes run in one process on one NATS
// (the first embeds it, the others join it with a service user's
// credentials); a sandbox made through each node's HTTP API is driven by
// that node and read through another's; one token serves them all; the
// log passes the checker; each node stops on its own.
func TestThreeNodesInOneProcess(t *testing.T) {
	first := startNode(t, testConfig(t, "n1"))
	file := serviceCreds(t, first)
	nodes := []*Node{first}
	for _, name := range []string{"n2", "n3"} {
		cfg := testConfig(t, name)
		cfg.NATSURL, cfg.NATSCreds, cfg.NATSListen = first.NATSURL(), file, ""
		nodes = append(nodes, startNode(t, cfg))
	}
	ctx := context.Background()
	client := func(n *Node) *torpor.Client { return torpor.New(n.HTTPURL(), nil).WithToken(first.AdminToken()) }
	for i, n := range nodes {
		v, err := client(n).Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
		if err != nil {
			t.Fatalf("create through %s: %v", n.Name(), err)
		}
		if v.Node != n.Name() {
			t.Errorf("a sandbox made through %s is on %q", n.Name(), v.Node)
		}
		other := nodes[(i+1)%len(nodes)]
		if _, err := client(other).Wait(ctx, v.ID, events.PhaseReady, 10*time.Second); err != nil {
			t.Errorf("%s's sandbox through %s: %v", n.Name(), other.Name(), err)
		}
	}
	vs, err := check.Replay(ctx, first.Store(), check.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Errorf("the log breaks an invariant: %v", v)
	}
	for _, n := range []*Node{nodes[2], nodes[1], nodes[0]} {
		if err := n.Stop(); err != nil {
			t.Errorf("stop %s: %v", n.Name(), err)
		}
	}
}
