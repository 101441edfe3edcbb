package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	torpor "github.com/torpor/torpor/sdk/go"
)

// natsServerBinary builds the module's own nats-server (go.mod's version,
// from the module cache) into a temp dir. Under CI=true a build that
// fails fails the test; elsewhere it skips it, loudly.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nats-server")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go build nats-server: %v\n%s", err, out)
		}
		t.Skipf("!!! go build nats-server: %v: torpor NOT tested on separate nats-server processes !!!\n%s", err, out)
	}
	return bin
}

// natsProcess is a nats-server run in a process of its own.
type natsProcess struct {
	name    string
	client  string // host:port for clients
	monitor string // host:port of its monitoring
	cmd     *exec.Cmd
	out     *lockedBuffer
	done    chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// rewrite replaces old by new in conf, which must hold old exactly once:
// deploy/nats/cluster changed shape otherwise, and this test with it.
func rewrite(t *testing.T, name, conf, old, new string) string {
	t.Helper()
	if n := strings.Count(conf, old); n != 1 {
		t.Fatalf("deploy/nats/cluster/%s.conf: %q %d times, want once (rewrite this test with the config)", name, old, n)
	}
	return strings.Replace(conf, old, new, 1)
}

// startNATSProcesses starts the three servers of deploy/nats/cluster, each
// a nats-server process of bin, on free loopback ports and stores in temp
// dirs, including the auth.conf of the bus whose keys are under data/auth
// (`torpor creds --server-config`), and waits until each is healthy with
// JetStream's meta group of all three.
func startNATSProcesses(t *testing.T, bin, data string) []*natsProcess {
	t.Helper()
	dir := t.TempDir()
	writeAuthConf(t, data, filepath.Join(dir, "auth", "auth.conf"))
	names := []string{"n1", "n2", "n3"}
	var client, route, monitor []string
	ports := freePorts(t, 3*len(names))
	for i := range names {
		client = append(client, fmt.Sprintf("127.0.0.1:%d", ports[3*i]))
		route = append(route, fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]))
		monitor = append(monitor, fmt.Sprintf("127.0.0.1:%d", ports[3*i+2]))
	}
	var ps []*natsProcess
	for i, name := range names {
		b, err := os.ReadFile("../../deploy/nats/cluster/" + name + ".conf")
		if err != nil {
			t.Fatal(err)
		}
		conf := string(b)
		conf = rewrite(t, name, conf, "listen: 0.0.0.0:4222", "listen: "+client[i])
		conf = rewrite(t, name, conf, "listen: 0.0.0.0:6222", "listen: "+route[i])
		conf = rewrite(t, name, conf, "http: 0.0.0.0:8222", "http: "+monitor[i])
		conf = rewrite(t, name, conf, fmt.Sprintf(`store_dir: "/data/%s/jetstream"`, name), fmt.Sprintf("store_dir: %q", filepath.Join(t.TempDir(), "jetstream")))
		for j, peer := range names {
			conf = rewrite(t, name, conf, "nats-route://"+peer+":6222", "nats-route://"+route[j])
		}
		file := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		p := &natsProcess{name: name, client: client[i], monitor: monitor[i], out: &lockedBuffer{}, done: make(chan struct{})}
		p.cmd = exec.Command(bin, "-c", file)
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = p.cmd.Wait(); close(p.done) }()
		t.Cleanup(func() {
			p.kill()
			if t.Failed() {
				t.Logf("nats-server %s:\n%s", p.name, p.out)
			}
		})
		ps = append(ps, p)
	}
	// Healthy, and JetStream's meta group of all three with its leader's
	// followers current: a stream asked for R3 sooner may wait out its
	// peers (a start that asked once, while the routes still settled,
	// timed out on its first R3 bucket).
	for _, p := range ps {
		eventually(t, "nats-server "+p.name+" healthy with a meta group of three", func() bool {
			meta, ok := metaCluster(p)
			if !ok || meta.Leader == "" || meta.Size != len(ps) {
				return false
			}
			if meta.Leader != p.name {
				return true
			}
			current := 0
			for _, r := range meta.Replicas {
				if r.Current {
					current++
				}
			}
			return current == len(ps)-1
		})
	}
	return ps
}

// metaGroup is what a server's /jsz says of JetStream's meta group.
type metaGroup struct {
	Leader   string `json:"leader"`
	Size     int    `json:"cluster_size"`
	Replicas []struct {
		Current bool `json:"current"`
	} `json:"replicas"`
}

// metaCluster is what p's monitoring says of JetStream's meta group, once
// its /healthz is OK.
func metaCluster(p *natsProcess) (metaGroup, bool) {
	resp, err := http.Get("http://" + p.monitor + "/healthz")
	if err != nil {
		return metaGroup{}, false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return metaGroup{}, false
	}
	if resp, err = http.Get("http://" + p.monitor + "/jsz"); err != nil {
		return metaGroup{}, false
	}
	defer resp.Body.Close()
	var jsz struct {
		Meta *metaGroup `json:"meta_cluster"`
	}
	if json.NewDecoder(resp.Body).Decode(&jsz) != nil || jsz.Meta == nil {
		return metaGroup{}, false
	}
	return *jsz.Meta, true
}

// waitPlacement waits until the servers ps place an R3 stream for the user
// of creds: JetStream enabled for its account on each server, and the meta
// leader counting every peer. A start sooner was refused, once "JetStream
// not enabled for account", once "no suitable peers for placement, peer
// offline", on servers healthy with a meta group of three.
func waitPlacement(t *testing.T, ps []*natsProcess, creds string) {
	t.Helper()
	ctx := context.Background()
	on := func(p *natsProcess, f func(jetstream.JetStream) error) bool {
		nc, err := nats.Connect("nats://"+p.client, nats.UserCredentials(creds), nats.NoReconnect())
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		return err == nil && f(js) == nil
	}
	for _, p := range ps {
		eventually(t, "JetStream for the account on "+p.name, func() bool {
			return on(p, func(js jetstream.JetStream) error { _, err := js.AccountInfo(ctx); return err })
		})
	}
	eventually(t, "an R3 stream placed", func() bool {
		return on(ps[0], func(js jetstream.JetStream) error {
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "deploy_probe", Subjects: []string{"deploy.probe"}, Replicas: 3, MaxBytes: 1 << 20}); err != nil {
				return err
			}
			return js.DeleteStream(ctx, "deploy_probe")
		})
	})
}

// kill SIGKILLs the process and waits for it to end.
func (p *natsProcess) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// TestNATSServerProcesses: torpor runs on three separately started
// nats-server processes, the module's own binary configured from
// deploy/nats/cluster (ports and stores rewritten, the auth.conf of `torpor
// creds --server-config` included). Once the cluster places R3 streams,
// `serve --nats-url n1,n2,n3 --nats-creds service.creds --replicas 3`
// starts on it, the log is R3 with both followers current, a sim sandbox
// is created, suspended and resumed, and the checker finds nothing. Then
// the server leading the log is SIGKILLed: a suspend sent again with its
// idempotency key until it is answered is answered within 20 s, the view
// reaches the last event of the sandbox's log within 30 s, and the checker
// still finds nothing. It prints what it survived.
func TestNATSServerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: three nats-server processes and an election")
	}
	bin := natsServerBinary(t)
	data := t.TempDir()
	ps := startNATSProcesses(t, bin, data)
	var urls []string
	for _, p := range ps {
		urls = append(urls, "nats://"+p.client)
	}
	svcCreds := credsFile(t, data, "service", "")
	waitPlacement(t, ps, svcCreds)
	a := startAppUnchecked(t, data, func(c *serveConfig) {
		c.NATSURL, c.NATSCreds, c.NATSListen, c.Replicas = strings.Join(urls, ","), svcCreds, "", 3
		// Every append waits for two of three servers to fsync it: on a
		// loaded machine a phase may take longer than the suite's 10 s.
		c.Deadline = 30 * time.Second
	})
	ctx := context.Background()
	js, err := jetstream.New(a.Conn())
	if err != nil {
		t.Fatal(err)
	}
	info := func() *jetstream.StreamInfo {
		t.Helper()
		s, err := js.Stream(ctx, "TORPOR_EVENTS")
		if err != nil {
			t.Fatal(err)
		}
		i, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	c := appClient(a)
	v := readySim(t, c, "on-processes")
	if _, err := c.Suspend(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseSuspended)
	if _, err := c.Resume(ctx, v.ID, torpor.ResumeOptions{}, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	checkCluster(t, a)
	var before *jetstream.StreamInfo
	eventually(t, "TORPOR_EVENTS R3 with a leader and two current followers", func() bool {
		before = info()
		if before.Config.Replicas != 3 || before.Cluster == nil || before.Cluster.Leader == "" || len(before.Cluster.Replicas) != 2 {
			return false
		}
		for _, r := range before.Cluster.Replicas {
			if !r.Current {
				return false
			}
		}
		return true
	})

	// SIGKILL the log's leader; the suspend goes on with the other two.
	var leader *natsProcess
	for _, p := range ps {
		if p.name == before.Cluster.Leader {
			leader = p
		}
	}
	if leader == nil {
		t.Fatalf("the log's leader %q is none of the processes", before.Cluster.Leader)
	}
	leader.kill()
	killed := time.Now()
	const bound = 20 * time.Second
	attempts := 0
	var refused error // the last refusal, if any
	for {
		attempts++
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Lifecycle(cctx, torpor.VerbSuspend, v.ID, false, "suspend-after-kill")
		cancel()
		if err == nil {
			break
		}
		refused = err
		if code := events.CodeOf(err); code != events.CodeUnavailable && code != events.CodeDeadlineExceeded {
			t.Fatalf("suspend after %s was killed: %v (want OK, or UNAVAILABLE while the log elects a leader)", leader.name, err)
		}
		if time.Since(killed) > bound {
			t.Fatalf("suspend after %s was killed: not answered within %s (%d attempts, last: %v)", leader.name, bound, attempts, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	answered := time.Since(killed)
	// The view converges: suspended, on the last event of the sandbox's
	// log, within convergeIn of the kill.
	const convergeIn = 30 * time.Second
	var converged time.Duration
	for {
		h, herr := c.History(ctx, v.ID, 0)
		got, err := c.Get(ctx, v.ID)
		converged = time.Since(killed)
		if herr == nil && err == nil && len(h) > 0 && got.Seq == h[len(h)-1].Seq && got.Phase == events.PhaseSuspended {
			break
		}
		if converged > convergeIn {
			t.Fatalf("the view not on the log within %s of the kill: view %+v (%v), log %d events (%v)", convergeIn, got, err, len(h), herr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := info()
	line := fmt.Sprintf("survived: %s (leader of TORPOR_EVENTS) SIGKILLed; the suspend answered after %s in %d attempts (last refusal: %v), the view converged after %s; the log is led by %s, R%d, seq %d",
		leader.name, answered.Round(time.Millisecond), attempts, refused, converged.Round(time.Millisecond), after.Cluster.Leader, after.Config.Replicas, after.State.LastSeq)
	t.Log(line)
	clusterFigures(t, line)
	if after.Cluster.Leader == leader.name || after.Config.Replicas != 3 {
		t.Errorf("after the kill: leader %q, R%d; want another leader, R3", after.Cluster.Leader, after.Config.Replicas)
	}
	checkCluster(t, a)
}

// checkCluster runs the checker over a's log and fails the test on every
// violation. A reading of the log that fails (an election under way: "event
// log unavailable") is tried again, within waitFor: it is the log not
// read, not the log broken.
func checkCluster(t *testing.T, a *app) {
	t.Helper()
	var (
		vs  []check.Violation
		err error
	)
	end := time.Now().Add(waitFor)
	for {
		if vs, err = check.Replay(context.Background(), a.Store(), check.Options{}); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the checker could not read the log within %s: %v", waitFor, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, v := range vs {
		t.Errorf("the log breaks an invariant: %v", v)
	}
}

// clusterFigures appends line, the figures a fault test survived, to the
// file TORPOR_FIGURES names, if set (CI prints it after the suite). A copy
// of services/node's.
func clusterFigures(t *testing.T, line string) {
	t.Helper()
	name := os.Getenv("TORPOR_FIGURES")
	if name == "" {
		return
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Errorf("figures: %v", err)
		return
	}
	if _, err := fmt.Fprintf(f, "%s: %s\n", t.Name(), line); err != nil {
		t.Errorf("figures: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("figures: %v", err)
	}
}
