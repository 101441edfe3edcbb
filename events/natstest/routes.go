package natstest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/torpor/torpor/internal/embedded"
)

// The routes of a Cluster go through proxies, one per pair of servers and
// direction (server i dials server j at the proxy (i, j), which forwards to
// j's route listener), so that a test can cut a server off from the others
// (Isolate) as a crash or a network partition would, where Kill, a
// graceful shutdown, first hands the server's raft leaderships over.
// Each server advertises a route address nothing listens on, so that no
// server learns another's real one from the others and dials it past the
// proxies.

// noRoute is the advertised route address of every proxied server:
// nothing listens on port 1.
const noRoute = "127.0.0.1:1"

// proxyRoutes puts a proxy on every route of cfgs (a cluster LayCluster
// laid out): proxies[i][j] carries server i's route to server j.
func proxyRoutes(cfgs []embedded.Config) ([][]*Proxy, error) {
	proxies := make([][]*Proxy, len(cfgs))
	var err error
	for i := range cfgs {
		proxies[i] = make([]*Proxy, len(cfgs))
		cfgs[i].Routes, cfgs[i].ClusterAdvertise = nil, noRoute
		for j := range cfgs {
			if j == i {
				continue
			}
			if proxies[i][j], err = NewProxy(cfgs[j].ClusterListen); err != nil {
				closeProxies(proxies)
				return nil, err
			}
			cfgs[i].Routes = append(cfgs[i].Routes, "nats-route://"+proxies[i][j].Addr())
		}
	}
	return proxies, nil
}

func closeProxies(proxies [][]*Proxy) {
	for _, row := range proxies {
		for _, p := range row {
			if p != nil {
				p.Close()
			}
		}
	}
}

// startProxied lays out a cluster of one server over each of dirs with
// its routes through proxies, starts its servers at once and waits for
// their meta leader (embedded.WaitMeta); a port taken between the layout
// and the start is laid out again, as embedded.StartCluster does.
func startProxied(name string, dirs []string, base embedded.Config, within time.Duration) ([]embedded.Config, []*server.Server, [][]*Proxy, error) {
	var err error
	for range 3 {
		var cfgs []embedded.Config
		if cfgs, err = embedded.LayCluster(name, dirs, base); err != nil {
			return nil, nil, nil, err
		}
		var proxies [][]*Proxy
		if proxies, err = proxyRoutes(cfgs); err != nil {
			return nil, nil, nil, err
		}
		servers := make([]*server.Server, len(cfgs))
		errs := make([]error, len(cfgs))
		var wg sync.WaitGroup
		for i, cfg := range cfgs {
			wg.Go(func() {
				if servers[i], errs[i] = embedded.Start(cfg); errs[i] != nil {
					errs[i] = fmt.Errorf("server %s: %w", cfg.Name, errs[i])
				}
			})
		}
		wg.Wait()
		if err = errors.Join(errs...); err == nil {
			err = embedded.WaitMeta(servers, within)
		}
		if err == nil {
			return cfgs, servers, proxies, nil
		}
		for _, s := range servers {
			if s != nil {
				s.Shutdown()
				s.WaitForShutdown()
			}
		}
		closeProxies(proxies)
	}
	return nil, nil, nil, err
}

// Isolate cuts server i off from the others: every route to or from it is
// closed at once and none is made again until Heal, as when its machine
// dies or the network parts it from the others. It learns nothing more of
// them, nor they of it: a raft leader there hands nothing over, and its
// groups elect a new leader among the others only at their election
// timeout. Its clients stay connected to it.
func (c *Cluster) Isolate(i int) {
	for j := range c.proxies {
		if j != i {
			c.proxies[i][j].Cut()
			c.proxies[j][i].Cut()
		}
	}
}

// Heal lets server i's routes be made again (after Isolate).
func (c *Cluster) Heal(i int) {
	for j := range c.proxies {
		if j != i {
			c.proxies[i][j].Heal()
			c.proxies[j][i].Heal()
		}
	}
}
