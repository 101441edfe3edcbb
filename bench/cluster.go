package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/internal/embedded"
)

// NodeStarter starts the torpor node name over the data directory dir (the
// bus's keys under dir/auth) on the NATS cluster at url (its servers'
// client URLs, comma-separated), connecting as the service user of the
// credentials file creds, every stream, bucket and object store with
// replicas copies: `torpor serve --nats-url url --nats-creds creds
// --replicas N` with the bench's defaults and fsync's. Stop stops it.
type NodeStarter func(ctx context.Context, dir, name, url, creds, fsync string, replicas int) (Service, error)

// startTries bounds the starts of each node of the cluster.
const startTries = 3

// clusterSize is how many NATS servers, and torpor nodes, the cluster
// section runs: the smallest cluster whose streams outlive a server.
const clusterSize = 3

// Cluster is the closed loop through clusterSize torpor nodes on a NATS
// cluster of as many in-process servers, every stream with a replica on
// each, next to the raw bus on the same cluster; the report sets it next
// to the single embedded node's closed loop of the same run.
type Cluster struct {
	Servers  int    `json:"servers"`
	Nodes    int    `json:"nodes"`
	Replicas int    `json:"replicas"`
	Fsync    string `json:"fsync"`
	// Auth is how the servers take clients: in operator mode with the
	// bus's accounts, as the single node's embedded server does.
	Auth string `json:"auth"`
	// RawAppendCheckSyncEPS and RawAppendCheckAsyncEPS are the raw appends
	// of Raw on a stream of Replicas copies on the cluster: the
	// denominator of the cluster's pipeline.
	RawAppendCheckSyncEPS  float64 `json:"raw_append_check_sync_eps"`
	RawAppendCheckAsyncEPS float64 `json:"raw_append_check_async_eps"`
	// Pipeline is the closed loop of the single node's Pipeline, its
	// clients on the servers in turn; ServerMsgsPerEvent sums every
	// server's messages, the routes' (replication) included.
	Pipeline Pipeline `json:"pipeline"`
	// Commands is how many commands each node's gateway handled during the
	// closed loop (its torpor_command_duration_seconds count), in the
	// order of NodeNames.
	NodeNames []string `json:"node_names"`
	Commands  []int64  `json:"commands_by_node"`
}

// RunCluster measures the raw bus and the closed loop on a fresh NATS
// cluster of clusterSize in-process servers (operator mode, the bus's keys
// made under a temporary directory) with clusterSize torpor nodes started
// by start, every stream with clusterSize replicas, in durability mode
// fsync. The clients are spread over the servers in turn: sandbox k is
// created and driven through server k mod 3, its outcomes read from a
// watch of the view through that server; the servers' queue group spreads
// the commands over the nodes' gateways.
func RunCluster(ctx context.Context, cfg Config, fsync string, start NodeStarter, progress io.Writer) (*Cluster, error) {
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, err
	}
	if start == nil {
		return nil, errors.New("no node starter for the cluster section")
	}
	dir, err := os.MkdirTemp("", "torpor-bench-cluster-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(progress, "bench: cluster of %d NATS servers (R%d, fsync %s), %d torpor nodes: raw bus, then %d sandboxes × %d clients over bus\n",
		clusterSize, clusterSize, fsync, clusterSize, cfg.Sandboxes, cfg.Concurrency)
	authDir := filepath.Join(dir, "auth")
	auth, err := busauth.Open(authDir, busauth.NoLimits)
	if err != nil {
		return nil, err
	}
	base := embedded.Config{SyncAlways: fsync == "always", Operator: auth.OperatorJWT, Accounts: auth.Accounts(), SystemAccount: auth.SystemKey}
	dirs := make([]string, clusterSize)
	for i := range dirs {
		dirs[i] = filepath.Join(dir, fmt.Sprintf("nats-%d", i+1))
	}
	scfgs, servers, err := embedded.StartCluster("torpor-bench", dirs, base, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("nats cluster: %w", err)
	}
	defer func() {
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}()
	user, err := auth.User("torpor bench", 0, busauth.Grant{Role: busauth.Service})
	if err != nil {
		return nil, err
	}
	creds, err := user.Creds()
	if err != nil {
		return nil, err
	}
	credsFile := filepath.Join(dir, "service.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		return nil, err
	}
	url := embedded.ClusterURL(scfgs)
	if err := warmAccounts(ctx, scfgs, auth); err != nil {
		return nil, err
	}
	c := &Cluster{Servers: clusterSize, Nodes: clusterSize, Replicas: clusterSize, Fsync: fsync, Auth: "operator mode, accounts (as the single node)"}
	var nodes []Service
	defer func() {
		for _, n := range nodes {
			_ = n.Stop()
		}
	}()
	for i := range clusterSize {
		name := fmt.Sprintf("c%d", i+1)
		data := filepath.Join(dir, "node-"+name)
		// Each node with the bus's keys, as serve's data directory has
		// them: it mints its supervisors' users and makes the clients'
		// copies, as the single node does.
		if err := os.CopyFS(filepath.Join(data, "auth"), os.DirFS(authDir)); err != nil {
			return nil, err
		}
		n, err := start(ctx, data, name, url, credsFile, fsync, clusterSize)
		for try := 2; err != nil && try <= startTries; try++ {
			// A node's first start on a cluster just formed may read a
			// bucket it has just made before its replicas answer ("no
			// responders"): started again, as a supervisor would.
			fmt.Fprintf(progress, "bench: node %s did not start (%v); starting it again\n", name, err)
			n, err = start(ctx, data, name, url, credsFile, fsync, clusterSize)
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		nodes = append(nodes, n)
		c.NodeNames = append(c.NodeNames, name)
	}

	// A connection to each server, as the service's user.
	conns := make([]*nats.Conn, clusterSize)
	for i, sc := range scfgs {
		if conns[i], err = nats.Connect("nats://"+sc.Listen, user.Options()...); err != nil {
			return nil, err
		}
		defer conns[i].Close()
	}
	rawDur := min(cfg.Duration/3, 3*time.Second)
	if c.RawAppendCheckSyncEPS, c.RawAppendCheckAsyncEPS, err = rawReplicated(ctx, conns[0], cfg.Sandboxes, cfg.Concurrency, clusterSize, rawDur); err != nil {
		return nil, err
	}
	cmds := make([]commander, clusterSize)
	vws := make([]*viewWaiter, clusterSize)
	for i, nc := range conns {
		js, _ := jetstream.New(nc)
		if vws[i], err = newViewWaiter(ctx, js); err != nil {
			return nil, err
		}
		defer vws[i].stop()
		cmds[i] = busCommander{nc: nc}
	}
	on := func(k int) (commander, *viewWaiter) { return cmds[k%clusterSize], vws[k%clusterSize] }
	ids, createRate, err := createReadyOn(ctx, on, cfg.Sandboxes, cfg.Concurrency)
	if err != nil {
		return nil, err
	}
	index := make(map[string]int, len(ids))
	for k, id := range ids {
		index[id] = k
	}
	js, _ := jetstream.New(conns[0])
	before, viewsBefore, err := logAndViewSeqs(ctx, js)
	if err != nil {
		return nil, err
	}
	served0, err := commandsServed(ctx, nodes)
	if err != nil {
		return nil, err
	}
	c0, err := readCost(servers...)
	if err != nil {
		return nil, err
	}
	stopProbe := probeHost()
	loop, err := cycle(ctx, func(ctx context.Context, verb, id string, target events.Phase) error {
		cmd, vw := on(index[id])
		return step(ctx, cmd, vw, verb, id, target)
	}, ids, cfg.Concurrency, cfg.Duration)
	host := stopProbe()
	if err != nil {
		return nil, err
	}
	c1, err := readCost(servers...)
	if err != nil {
		return nil, err
	}
	served1, err := commandsServed(ctx, nodes)
	if err != nil {
		return nil, err
	}
	after, viewsAfter, err := logAndViewSeqs(ctx, js)
	if err != nil {
		return nil, err
	}
	p := Pipeline{
		Transport: "bus", Sandboxes: cfg.Sandboxes, Concurrency: cfg.Concurrency, Seconds: loop.secs,
		Transitions: loop.transitions, Events: after - before, TransitionsPerS: float64(loop.transitions) / loop.secs,
		EventsPerS: float64(after-before) / loop.secs, CreateToReadyPerS: createRate, ViewWrites: viewsAfter - viewsBefore, Host: host,
	}
	p.CPUMsPerTransition, p.CoresBusy, p.ServerMsgsPerEvent = c1.spent(c0, int(loop.transitions), after-before)
	p.P50, p.P90, p.P99, _ = percentiles(loop.lats)
	c.Pipeline = p
	for i := range served1 {
		c.Commands = append(c.Commands, served1[i]-served0[i])
	}
	return c, nil
}

// rawReplicated measures the raw appends with the check of measureRaw,
// one at a time and with an async window of concurrency, on a stream with
// replicas copies, through nc: the bus's own cost of a replicated log.
func rawReplicated(ctx context.Context, nc *nats.Conn, subjects, concurrency, replicas int, d time.Duration) (syncEPS, asyncEPS float64, err error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(concurrency))
	if err != nil {
		return 0, 0, err
	}
	const stream = "BENCH_RAW_REPLICATED"
	if err := createPlaced(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{"bench.replicated.>"}, Storage: jetstream.FileStorage, Replicas: replicas}); err != nil {
		return 0, 0, fmt.Errorf("raw replicated stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	const prefix = "bench.replicated."
	last := make([]uint64, subjects)
	n, t0 := 0, time.Now()
	for time.Since(t0) < d {
		i := n % subjects
		ack, err := js.Publish(ctx, prefix+strconv.Itoa(i), body300, jetstream.WithExpectLastSequencePerSubject(last[i]))
		if err != nil {
			return 0, 0, fmt.Errorf("raw replicated sync append: %w", err)
		}
		last[i] = ack.Sequence
		n++
	}
	syncEPS = float64(n) / time.Since(t0).Seconds()
	if _, asyncEPS, err = appendAsync(ctx, js, prefix, last, body300, d, nil); err != nil {
		return 0, 0, fmt.Errorf("raw replicated async append: %w", err)
	}
	return syncEPS, asyncEPS, nil
}

// createPlaced creates the stream of cfg, asking again for up to 10 s
// while the meta leader finds no peers to place its replicas on: on a
// machine this busy a server's statistics can come late, and the leader
// counts it offline meanwhile.
func createPlaced(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	end := time.Now().Add(10 * time.Second)
	for {
		_, err := js.CreateStream(ctx, cfg)
		var api *jetstream.APIError
		if err == nil || !errors.As(err, &api) || api.ErrorCode != noPeers || time.Now().After(end) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// noPeers is the JetStream API error code of "no suitable peers for
// placement".
const noPeers = 10005

// commandsServed is how many commands each of nodes has handled so far:
// the count of torpor_command_duration_seconds on its GET /metrics.
func commandsServed(ctx context.Context, nodes []Service) ([]int64, error) {
	counts := make([]int64, len(nodes))
	for i, n := range nodes {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.HTTPAddr()+"/metrics", nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+n.AdminToken())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		counts[i], err = commandCount(resp)
		if err != nil {
			return nil, err
		}
	}
	return counts, nil
}

// commandCount sums the torpor_command_duration_seconds_count series of a
// /metrics answer.
func commandCount(resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics: %s", resp.Status)
	}
	var n int64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "torpor_command_duration_seconds_count") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics: %q: %w", line, err)
		}
		n += int64(v)
	}
	return n, sc.Err()
}

// clusterRatios sets the ratios of the cluster c to single, the single
// node's run in the same mode: of the closed loops' transitions/s and p50,
// of the raw async appends (the bus's own cost of three copies), and of the
// cluster's pipeline to its raw async append (single's
// pipeline_vs_raw_append on the cluster).
func (r *Report) clusterRatios(single Mode, c *Cluster) {
	if s := single.Pipeline; s.TransitionsPerS > 0 && s.P50 > 0 {
		r.Ratios["cluster_vs_single_transitions"] = c.Pipeline.TransitionsPerS / s.TransitionsPerS
		r.Ratios["cluster_vs_single_p50"] = c.Pipeline.P50 / s.P50
	}
	if s := single.Raw.AppendCheckAsyncEPS; s > 0 {
		r.Ratios["cluster_vs_single_raw_append"] = c.RawAppendCheckAsyncEPS / s
	}
	if c.RawAppendCheckAsyncEPS > 0 {
		r.Ratios["cluster_pipeline_vs_raw_append"] = c.Pipeline.EventsPerS / c.RawAppendCheckAsyncEPS
	}
}

// printCluster writes the cluster's closed loop as a row under the single
// node's of the same mode, and the ratios of the two.
func (r *Report) printCluster(w io.Writer) {
	c := r.Cluster
	var single Mode
	for _, m := range r.Modes {
		if m.Fsync == c.Fsync {
			single = m
			break
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "closed loop over bus (fsync %s)\tservers\tnodes\treplicas\traw sync append/s\traw async append/s\tpipeline events/s\ttransitions/s\tratio\tp50 ms\tp99 ms\tCPU ms/transition\t\n", c.Fsync)
	row := func(name string, n int, rawSync, rawAsync float64, p Pipeline) {
		ratio := 0.0
		if rawAsync > 0 {
			ratio = p.EventsPerS / rawAsync
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", name, n, n, n, rawSync, rawAsync, p.EventsPerS, p.TransitionsPerS, ratio, p.P50, p.P99, p.CPUMsPerTransition)
	}
	row("single embedded node", 1, single.Raw.AppendCheckSyncEPS, single.Raw.AppendCheckAsyncEPS, single.Pipeline)
	row(fmt.Sprintf("cluster, R%d", c.Replicas), c.Servers, c.RawAppendCheckSyncEPS, c.RawAppendCheckAsyncEPS, c.Pipeline)
	tw.Flush()
	var by []string
	for i, name := range c.NodeNames {
		by = append(by, fmt.Sprintf("%s %d", name, c.Commands[i]))
	}
	fmt.Fprintf(w, "cluster ÷ single (fsync %s, same run): transitions/s %.2f, p50 %.2f×, raw async append %.2f; commands handled by node: %s; %.1f server messages per event over the %d servers (single: %.1f); auth: %s\n",
		c.Fsync, r.Ratios["cluster_vs_single_transitions"], r.Ratios["cluster_vs_single_p50"], r.Ratios["cluster_vs_single_raw_append"],
		strings.Join(by, ", "), c.Pipeline.ServerMsgsPerEvent, c.Servers, single.Pipeline.ServerMsgsPerEvent, c.Auth)
}

// warmAccounts waits until every server of cfgs serves JetStream to the
// service's and the clients' accounts. On a cluster just formed a node's
// first stream of the clients' account was refused once with "jetstream not
// enabled for account" (the servers load an account when it is first
// used); each server is asked first, so that the nodes start on servers
// that know both accounts.
func warmAccounts(ctx context.Context, cfgs []embedded.Config, auth *busauth.Auth) error {
	for _, role := range []busauth.Role{busauth.Service, busauth.ClientsService} {
		u, err := auth.User("torpor bench warm-up", time.Minute, busauth.Grant{Role: role})
		if err != nil {
			return err
		}
		for _, sc := range cfgs {
			if err := warmAccount(ctx, "nats://"+sc.Listen, u.Options()); err != nil {
				return fmt.Errorf("%s account on %s: %w", role, sc.Name, err)
			}
		}
	}
	return nil
}

// warmAccount asks the server at url for its account's JetStream
// information, as the user of opts, until it answers (within 30 s).
func warmAccount(ctx context.Context, url string, opts []nats.Option) error {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := js.AccountInfo(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
