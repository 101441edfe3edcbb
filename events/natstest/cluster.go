package natstest

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/internal/embedded"
)

// Cluster is a NATS cluster of in-process servers with clustered
// JetStream, each listening for clients and routes on loopback, each with
// its store under a directory of its own: a server can be killed, restarted
// on its store, or restarted with its store lost, and cut off from the
// others (its routes go through proxies, routes.go).
type Cluster struct {
	t    testing.TB
	auth *busauth.Auth
	// cfgs[i] is server i's: its store, its client and route addresses,
	// kept across restarts.
	cfgs []embedded.Config
	mu   sync.Mutex
	// servers[i] is nil while server i is down.
	servers []*server.Server
	// proxies[i][j] carries server i's route to server j (Isolate).
	proxies [][]*Proxy
}

// StartCluster runs n servers in one cluster (n ≥ 3 for a quorum that
// outlives a server) in auth's operator mode, and waits until JetStream has
// a meta leader. Every server is shut down at cleanup.
func StartCluster(t testing.TB, n int, auth *busauth.Auth) *Cluster {
	t.Helper()
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	var base embedded.Config
	if auth != nil {
		base.Operator, base.Accounts, base.SystemAccount = auth.OperatorJWT, auth.Accounts(), auth.SystemKey
	}
	cfgs, servers, proxies, err := startProxied("torpor-test", dirs, base, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, auth: auth, cfgs: cfgs, servers: servers, proxies: proxies}
	t.Cleanup(func() {
		for i := range n {
			c.Kill(i)
		}
		closeProxies(proxies)
	})
	return c
}

// start starts server i on its store.
func (c *Cluster) start(i int) error {
	s, err := embedded.Start(c.cfgs[i])
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.servers[i] = s
	c.mu.Unlock()
	return nil
}

// URL is every server's client URL, comma-separated, as nats.Connect and
// --nats-url take a cluster.
func (c *Cluster) URL() string { return embedded.ClusterURL(c.cfgs) }

// JetStream is a JetStream client of a cluster without auth, its
// connection closed with the test: through any of its servers (i < 0), or
// through server i alone (say the leader of a stream that keeps it after
// the others are gone).
func (c *Cluster) JetStream(t testing.TB, i int) jetstream.JetStream {
	t.Helper()
	if c.auth != nil {
		t.Fatal("natstest: Cluster.JetStream connects without credentials; this cluster has auth")
	}
	url := c.URL()
	if i >= 0 {
		s := c.Server(i)
		if s == nil {
			t.Fatalf("natstest: server %d is down", i)
		}
		url = s.ClientURL()
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Server is server i, nil while it is down.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// Size is how many servers the cluster has, up or down.
func (c *Cluster) Size() int { return len(c.servers) }

// Kill shuts server i down at once, its store kept; a server down already
// is left so.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts server i again on its store (after Kill).
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if err := c.start(i); err != nil {
		c.t.Fatalf("restart server %d: %v", i, err)
	}
	c.WaitLeader(30 * time.Second)
}

// Wipe kills server i, deletes its store and starts it empty: it catches
// up from the others.
func (c *Cluster) Wipe(i int) {
	c.t.Helper()
	c.Kill(i)
	if err := os.RemoveAll(filepath.Join(c.cfgs[i].Data, "jetstream")); err != nil {
		c.t.Fatal(err)
	}
	c.Restart(i)
}

// StreamLeader is the index of the server that leads stream of account
// (a public key; the service's account when empty), -1 when none does.
func (c *Cluster) StreamLeader(account, stream string) int {
	if account == "" && c.auth != nil {
		account = c.auth.AccountKey
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.servers {
		if s != nil && s.JetStreamIsStreamLeader(account, stream) {
			return i
		}
	}
	return -1
}

// WaitLeader waits until a server up is the JetStream meta leader and
// every server up is current with it (embedded.WaitMeta).
func (c *Cluster) WaitLeader(within time.Duration) {
	c.t.Helper()
	c.mu.Lock()
	servers := slices.Clone(c.servers)
	c.mu.Unlock()
	if err := embedded.WaitMeta(servers, within); err != nil {
		c.t.Fatal(err)
	}
}
