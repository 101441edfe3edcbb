package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
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

// TestClusterFaults: three torpor nodes and a worker on a NATS cluster of
// three servers, every stream R3. While sandboxes go through their cycle
// through random nodes, one fault at a time: (a) the server that leads the
// log dies (and comes back once another leads), (b) the server that leads
// the view's bucket dies (likewise), (c) a server restarts on its store,
// (d) a server loses its store and comes back empty. After each: no
// acknowledged command lost, every sandbox settles and its view catches up
// with its log, the checker finds nothing (cluster.converge).
func TestClusterFaults(t *testing.T) {
	s := seed(t)
	// The nodes' deadline is serve's default, 2m, not onNATSCluster's 30 s:
	// a crash loses the answers in flight through the dead server, and a
	// driver call whose answer was lost (a delete, a suspend) waits out
	// remote.LongTimeout, 30 s, before its saga calls again; the node
	// cannot count that as an outage of its own (README, "No deadline
	// fires because of it": keep --deadline well above it). With 30 s, (b)
	// saw a delete's deadline pass so, about one run in four.
	c := newCluster(t, 3, 3, nil, onNATSCluster(3), func(c *cluster) { c.deadline = 2 * time.Minute })
	rng := rand.New(rand.NewPCG(s, 25))
	pick := rand.New(rand.NewPCG(s, 26)) // the faults', beside the load's rng (which live() guards)
	wiped := -1                          // the server (d) wiped, until it is found caught up
	// leaderless kills the server leading stream as a crash would (cut
	// off from the others first, so that its shutdown hands no
	// leadership over: Kill alone is a graceful shutdown, a new leader
	// within ~0.1 s), waits until another leads it, and starts it again
	// on its store: how long the stream had no leader, the others'
	// election timeout (4 to 9 s in nats-server).
	leaderless := func(stream string) func(t *testing.T) string {
		return func(t *testing.T) string {
			i := c.nats.StreamLeader("", stream)
			if i < 0 {
				t.Fatalf("no server leads %s", stream)
			}
			began := time.Now()
			c.nats.Isolate(i)
			c.nats.Kill(i)
			for c.nats.StreamLeader("", stream) < 0 {
				if time.Since(began) > time.Minute {
					t.Fatalf("%s without a leader for a minute", stream)
				}
				time.Sleep(10 * time.Millisecond)
			}
			election := time.Since(began)
			if election < 2*time.Second {
				// Half the least election timeout: leadership handed over.
				t.Errorf("%s had a new leader %s after n%d was killed: handed over, want a crash's election", stream, election.Round(time.Millisecond), i+1)
			}
			c.nats.Heal(i)
			c.nats.Restart(i)
			return fmt.Sprintf("server n%d leading %s cut off and killed, %s leaderless for %s, n%d back", i+1, stream, stream, election.Round(time.Millisecond), i+1)
		}
	}
	faults := []struct {
		name   string
		inject func(t *testing.T) string
	}{
		{"a: the log's leader dies", leaderless("TORPOR_EVENTS")},
		{"b: the view's leader dies", leaderless("KV_torpor_phases")},
		{"c: a server restarts on its store", func(t *testing.T) string {
			i := pick.IntN(c.nats.Size())
			c.nats.Kill(i)
			c.nats.Restart(i)
			return fmt.Sprintf("server n%d restarted on its store", i+1)
		}},
		{"d: a server loses its store", func(t *testing.T) string {
			wiped = pick.IntN(c.nats.Size())
			c.nats.Wipe(wiped)
			return fmt.Sprintf("server n%d came back with its store lost", wiped+1)
		}},
	}
	for k, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			const sandboxes = 9
			done := make(chan string, 1)
			acks, complete := c.load(t, rng, sandboxes, func(i, step int) {
				if i == 4 && step == 1 {
					go func() { done <- f.inject(t) }()
				}
			})
			what := <-done
			settled := c.converge(t, acks)
			if wiped >= 0 {
				// The server that lost its store holds the whole log
				// again, current with its leader.
				what += "; " + caughtUp(t, c, wiped, "TORPOR_EVENTS")
				wiped = -1
			}
			// The checker's count (converge fails the test on any).
			vs, err := check.Replay(context.Background(), c.liveNode().Store(), check.Options{})
			if err != nil {
				t.Fatal(err)
			}
			survived(t, "survived fault %d (seed %d): %s; %d commands answered OK, %d of %d sandboxes through their cycle; settled in %s; %d violations",
				k, s, what, len(acks), complete, sandboxes, settled.Round(time.Millisecond), len(vs))
			if complete != sandboxes {
				t.Errorf("%d of %d sandboxes went through their cycle", complete, sandboxes)
			}
		})
	}
}

// caughtUp waits until server i's replica of stream holds the stream's
// last sequence and its leader counts it current, and says when; it fails
// the test after a minute.
func caughtUp(t *testing.T, c *cluster, i int, stream string) string {
	t.Helper()
	began := time.Now()
	var mine, last uint64
	for {
		l := c.nats.StreamLeader("", stream)
		if l >= 0 {
			lead, info := replicaOf(t, c.nats.Server(l), c.auth.AccountKey, stream)
			own, _ := replicaOf(t, c.nats.Server(i), c.auth.AccountKey, stream)
			mine, last = own.LastSeq, lead.LastSeq
			current := l == i
			if info != nil {
				for _, p := range info.Replicas {
					if p.Name == fmt.Sprintf("n%d", i+1) && p.Current && !p.Offline {
						current = true
					}
				}
			}
			if current && mine == last && last > 0 {
				return fmt.Sprintf("n%d's replica of %s current at its last seq %d %s after the load settled", i+1, stream, last, time.Since(began).Round(time.Millisecond))
			}
		}
		if time.Since(began) > time.Minute {
			t.Fatalf("n%d's replica of %s at seq %d a minute after the load settled, the leader's at %d", i+1, stream, mine, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// replicaOf is the state of stream of account on srv (its own replica) and
// its cluster info as srv knows it (the replicas' lag when srv leads it);
// zero values when srv is down or holds no replica.
func replicaOf(t *testing.T, srv *server.Server, account, stream string) (server.StreamState, *server.ClusterInfo) {
	t.Helper()
	if srv == nil {
		return server.StreamState{}, nil
	}
	jsz, err := srv.Jsz(&server.JSzOptions{Account: account, Streams: true})
	if err != nil {
		return server.StreamState{}, nil
	}
	for _, a := range jsz.AccountDetails {
		for _, sd := range a.Streams {
			if sd.Name == stream {
				return sd.State, sd.Cluster
			}
		}
	}
	return server.StreamState{}, nil
}

// TestStartWaitsForTheCluster: a serve --replicas 3 started while two of
// the three NATS servers are down (a cluster coming up: no JetStream
// quorum) waits, saying so, until the cluster can place R3 streams, and
// starts once the servers are back, rather than failing. A restart with
// one server of three down starts at once.
func TestStartWaitsForTheCluster(t *testing.T) {
	c := newCluster(t, 0, 0, nil, onNATSCluster(3))
	c.nats.Kill(1)
	c.nats.Kill(2)
	cfg := testConfig(t, "ctl")
	cfg.NATSURL, cfg.NATSCreds, cfg.NATSListen, cfg.Replicas = c.url(), c.service, "", 3
	if err := os.CopyFS(filepath.Join(cfg.Data, "auth"), os.DirFS(c.authDir)); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var once sync.Once
	log := zerolog.New(writerTo(func(p []byte) {
		if strings.Contains(string(p), "does not take streams yet") {
			once.Do(func() { close(waiting) })
		}
	}))
	started := make(chan error, 1)
	go func() {
		n, err := Start(context.Background(), cfg, log)
		if err == nil {
			t.Cleanup(func() { _ = n.Stop() })
		}
		started <- err
	}()
	select {
	case <-waiting:
	case err := <-started:
		t.Fatalf("started on a cluster with two servers of three down: %v, want a wait for it", err)
	}
	c.nats.Restart(1)
	c.nats.Restart(2)
	if err := <-started; err != nil {
		t.Fatalf("start once the cluster is whole: %v", err)
	}
	// A restart with one server of three down (the cluster degraded, its
	// streams served by the other two) starts without waiting for it.
	c.nats.Kill(0)
	again := testConfig(t, "ctl")
	again.NATSURL, again.NATSCreds, again.NATSListen, again.Replicas = c.url(), c.service, "", 3
	if err := os.CopyFS(filepath.Join(again.Data, "auth"), os.DirFS(c.authDir)); err != nil {
		t.Fatal(err)
	}
	n, err := Start(context.Background(), again, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	if err != nil {
		t.Fatalf("start with one server of three down: %v", err)
	}
	_ = n.Stop()
}

// writerTo is an io.Writer that hands each write to f.
type writerTo func(p []byte)

func (f writerTo) Write(p []byte) (int, error) {
	f(p)
	return len(p), nil
}
