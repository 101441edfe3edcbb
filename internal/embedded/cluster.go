package embedded

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// LayCluster lays out a cluster named name of one server over each of
// dirs: server i keeps its store under dirs[i], is named n<i+1>, and
// listens for clients and for routes on loopback ports nothing listened on
// a moment ago, fixed so that a server started again is found where it
// was; its routes are the others'. The other fields come from base
// (operator, accounts, fsync). The tests' clusters and the bench's are
// laid out here, so that they run the same servers.
func LayCluster(name string, dirs []string, base Config) ([]Config, error) {
	if name == "" || len(dirs) == 0 {
		return nil, errors.New("a cluster wants a name and a directory per server")
	}
	routes := make([]string, len(dirs))
	cfgs := make([]Config, len(dirs))
	for i, dir := range dirs {
		client, err := freeAddr()
		if err != nil {
			return nil, err
		}
		if routes[i], err = freeAddr(); err != nil {
			return nil, err
		}
		cfg := base
		cfg.Data, cfg.Listen, cfg.Name, cfg.Cluster, cfg.ClusterListen = dir, client, fmt.Sprintf("n%d", i+1), name, routes[i]
		cfgs[i] = cfg
	}
	for i := range cfgs {
		cfgs[i].Routes = nil
		for j, r := range routes {
			if j != i {
				cfgs[i].Routes = append(cfgs[i].Routes, "nats-route://"+r)
			}
		}
	}
	return cfgs, nil
}

// freeAddr is a loopback address with a port nothing listened on a moment
// ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// StartCluster lays out a cluster named name over dirs (LayCluster),
// starts its servers at once, as a cluster forms only with its routes up,
// and waits up to within until JetStream has a meta leader that counts
// every server as a peer it can place a stream's replica on (a stream with
// a replica on each is refused until then). A port taken between the
// layout and the start (by another socket of this machine) fails the
// start: it is laid out again, at most clusterTries times. It returns the
// servers' configs, to start one again, and the servers, which the caller
// shuts down.
func StartCluster(name string, dirs []string, base Config, within time.Duration) ([]Config, []*server.Server, error) {
	var err error
	for range clusterTries {
		var cfgs []Config
		if cfgs, err = LayCluster(name, dirs, base); err != nil {
			return nil, nil, err
		}
		var servers []*server.Server
		if servers, err = startAll(cfgs, within); err == nil {
			return cfgs, servers, nil
		}
	}
	return nil, nil, err
}

// clusterTries bounds the layouts StartCluster tries.
const clusterTries = 3

// startAll starts the servers of cfgs and waits for their meta leader
// (waitPeers); on an error it shuts down those it started.
func startAll(cfgs []Config, within time.Duration) ([]*server.Server, error) {
	servers := make([]*server.Server, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() {
			if servers[i], errs[i] = Start(cfg); errs[i] != nil {
				errs[i] = fmt.Errorf("server %s: %w", cfg.Name, errs[i])
			}
		})
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		err = WaitMeta(servers, within)
	}
	if err != nil {
		for _, s := range servers {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
		return nil, err
	}
	return servers, nil
}

// WaitMeta waits up to within until one of servers is the JetStream meta
// leader and every one up (not nil) is current with it; with all of them up,
// until the leader also counts them all as peers. A peer not yet caught up
// is taken for offline, and a stream with replicas then finds no place.
// servers is read at each look: a caller that replaces a server holds its
// own lock around a copy.
func WaitMeta(servers []*server.Server, within time.Duration) error {
	end := time.Now().Add(within)
	for !metaWhole(servers) {
		if time.Now().After(end) {
			return fmt.Errorf("no JetStream meta leader with every server up current within %s", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// metaWhole says whether servers have the meta group WaitMeta waits for.
func metaWhole(servers []*server.Server) bool {
	var leader *server.Server
	up := 0
	for _, s := range servers {
		if s == nil {
			continue
		}
		up++
		if !s.JetStreamIsCurrent() {
			return false
		}
		if s.JetStreamIsLeader() {
			leader = s
		}
	}
	return leader != nil && (up < len(servers) || len(leader.JetStreamClusterPeers()) == len(servers))
}

// ClusterURL is the client URLs of cfgs, comma-separated, as nats.Connect
// and --nats-url take a cluster.
func ClusterURL(cfgs []Config) string {
	urls := make([]string, len(cfgs))
	for i, c := range cfgs {
		urls[i] = "nats://" + c.Listen
	}
	return strings.Join(urls, ",")
}
