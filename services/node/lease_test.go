package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/internal/busauth"
	torpor "github.com/torpor/torpor/sdk/go"
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
