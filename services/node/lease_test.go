package node

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/internal/busauth"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute/remote"
)

// serviceCreds writes a service user's credentials for first's NATS to a
// file, for other nodes to join it.
func serviceCreds(t *testing.T, first *Node) string {
	t.Helper()
	u, err := first.Auth().User("joining", time.Hour, busauth.Grant{Role: busauth.Service})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := u.Creds()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "service.creds")
	if err := os.WriteFile(file, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestOneRunnerPerNode: two processes serve node n1 on one NATS (n0 embeds
// it): a sandbox made on n1 is started once, by one of them (the one
// holding n1's lease). The holder stopping hands the sagas to the other at
// once; that one crashing (its NATS connection cut: nothing released)
// hands them to a third within the lease's TTL.
func TestOneRunnerPerNode(t *testing.T) {
	const ttl = 3 * time.Second
	hub := startNode(t, testConfig(t, "n0"))
	file := serviceCreds(t, hub)
	join := func() *Node {
		cfg := testConfig(t, "n1")
		cfg.NATSURL, cfg.NATSCreds, cfg.NATSListen = hub.NATSURL(), file, ""
		cfg.LeaseTTL = ttl
		return startNode(t, cfg)
	}
	ctx := context.Background()
	// create makes a sandbox through n and waits until it is ready, at most
	// within; it returns how long that took.
	create := func(n *Node, within time.Duration) time.Duration {
		t.Helper()
		began := time.Now()
		c := torpor.New(n.HTTPURL(), nil).WithToken(hub.AdminToken())
		v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if _, err := c.Wait(ctx, v.ID, events.PhaseReady, within); err != nil {
			t.Fatalf("sandbox %s not ready within %s: %v", v.ID, within, err)
		}
		return time.Since(began)
	}
	starts := func(n *Node) int { return n.Sim().Calls()["start"] }

	a, b := join(), join()
	create(a, 10*time.Second)
	holder, other := a, b
	if starts(b) > 0 {
		holder, other = b, a
	}
	if got := starts(a) + starts(b); got != 1 {
		t.Fatalf("a sandbox on n1 was started %d times by its two processes (%d and %d), want once", got, starts(a), starts(b))
	}

	// A clean stop releases the lease: the other drives the next sandbox
	// at once, before the lease could have run out (at the earliest TTL
	// less a renewal period after the stop).
	if err := holder.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	took := create(other, ttl/2)
	t.Logf("after a clean stop, the next sandbox was ready in %s", took)
	if got := starts(other); got != 1 {
		t.Fatalf("the second process started %d sandboxes, want 1", got)
	}

	// A crash: no release. A third process takes over once the lease runs
	// out (TTL, plus at most a renewal period since the last renewal).
	third := join()
	other.Conn().Close()
	took = create(third, ttl+ttl/4+5*time.Second)
	t.Logf("after a crash, the next sandbox was ready in %s (lease TTL %s)", took, ttl)
	if took > 2*ttl+time.Second {
		t.Errorf("after a crash the sagas were taken over in %s, want within about the TTL (%s)", took, ttl)
	}
	if got := starts(third); got != 1 {
		t.Errorf("the third process started %d sandboxes, want 1", got)
	}
	if got := starts(other); got != 1 {
		t.Errorf("the crashed process started %d sandboxes, want still 1", got)
	}

	vs, err := check.Replay(ctx, hub.Store(), check.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Errorf("the log breaks an invariant: %v", v)
	}
}

// TestOneRunnerPerRemoteNode: two processes serving nodes n1 and n2 both
// drive the worker node w1 (--remote-nodes w1, its drivers served on the
// bus by `torpor driver --node w1`): a sandbox made on w1 is started there
// once, by the one holding w1's lease; when that one stops, the other
// drives w1's next sandbox.
func TestOneRunnerPerRemoteNode(t *testing.T) {
	hub := startNode(t, testConfig(t, "n0"))
	file := serviceCreds(t, hub)
	u, err := hub.Auth().User("w1 driver", time.Hour, busauth.Grant{Role: busauth.Driver, Node: "w1", SimReports: true})
	if err != nil {
		t.Fatal(err)
	}
	dcreds, err := u.Creds()
	if err != nil {
		t.Fatal(err)
	}
	dfile := filepath.Join(t.TempDir(), "driver.creds")
	if err := os.WriteFile(dfile, dcreds, 0o600); err != nil {
		t.Fatal(err)
	}
	dctx, stopDriver := context.WithCancel(context.Background())
	driverDone := make(chan error, 1)
	up, upw := io.Pipe()
	go func() {
		driverDone <- RunDriver(dctx, DriverConfig{Node: "w1", Drivers: []string{"sim"}, NATSURL: hub.NATSURL(), NATSCreds: dfile, Data: t.TempDir(), Heartbeat: time.Second}, upw, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
		_ = upw.Close()
	}()
	t.Cleanup(func() { stopDriver(); <-driverDone })
	if _, err := bufio.NewReader(up).ReadString('\n'); err != nil {
		t.Fatalf("torpor driver w1 did not come up: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, up) }()

	// Every start asked of w1's drivers, counted on the bus.
	var mu sync.Mutex
	starts := 0
	sub, err := hub.Conn().Subscribe(remote.Subject("w1", "start"), func(*nats.Msg) {
		mu.Lock()
		starts++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := hub.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	started := func() int { mu.Lock(); defer mu.Unlock(); return starts }

	join := func(name string) *Node {
		cfg := testConfig(t, name)
		cfg.NATSURL, cfg.NATSCreds, cfg.NATSListen = hub.NATSURL(), file, ""
		cfg.RemoteNodes, cfg.LeaseTTL = []string{"w1"}, 3*time.Second
		return startNode(t, cfg)
	}
	n1, n2 := join("n1"), join("n2")
	ctx := context.Background()
	create := func(through *Node, within time.Duration) {
		t.Helper()
		c := torpor.New(through.HTTPURL(), nil).WithToken(hub.AdminToken())
		v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim", Node: "w1"}, "")
		if err != nil {
			t.Fatalf("create on w1 through %s: %v", through.Name(), err)
		}
		if _, err := c.Wait(ctx, v.ID, events.PhaseReady, within); err != nil {
			t.Fatalf("sandbox %s on w1 not ready within %s: %v", v.ID, within, err)
		}
	}
	create(n1, 10*time.Second)
	if err := hub.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if got := started(); got != 1 {
		t.Fatalf("a sandbox on w1 was started %d times by the runners of n1 and n2, want once", got)
	}
	// Whichever holds w1's lease stops; the other drives w1 at once.
	if err := n1.Stop(); err != nil {
		t.Fatal(err)
	}
	create(n2, 1500*time.Millisecond)
	if err := n2.Stop(); err != nil {
		t.Fatal(err)
	}
	if got := started(); got != 2 {
		t.Errorf("two sandboxes on w1 were started %d times, want twice", got)
	}
}
