package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/internal/embedded"
	"github.com/torpor/torpor/sagas"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
	"github.com/torpor/torpor/services/compute/remote"
	"github.com/torpor/torpor/services/gateway"
)

// The fault tests: several torpor nodes on one NATS server of their own,
// and a worker node (`torpor driver`, node.RunDriver) whose sim driver runs
// every sandbox; commands go to random nodes while faults are injected.
// Each prints what it survived.

// cluster is a NATS server with the bus's keys, the torpor nodes that
// joined it, and the worker.
type cluster struct {
	t       *testing.T
	auth    *busauth.Auth
	authDir string
	ns      *server.Server
	service string // a service user's credentials file
	driver  string // the worker's credentials file
	// faults, when set, wraps each node's appends (faultyStore).
	faults *faults
	token  string     // the first node's admin token (tokens are shared)
	mu     sync.Mutex // nodes, which the chaos replaces
	nodes  []*Node
	// driving is how many of the nodes drive the worker's sandboxes (the
	// first ones).
	driving int
	worker  *worker
	// process makes the worker serve the process driver (supervisors that
	// heartbeat) through proxy, in place of the sim.
	process bool
	proxy   *natstest.Proxy
	// proxied puts the worker behind proxy whatever its driver.
	proxied bool
	// deadline and limit are the nodes' --deadline and --heartbeat-limit.
	deadline, limit time.Duration
	// again counts the commands the load sent again after they failed
	// honestly (the sandbox back where it was).
	again atomic.Int64
	// options are the sim's driver options of every sandbox the load
	// creates (answer_delay, say: each answer in flight that long).
	options map[string]string
	// servers, when set, is the size of a NATS cluster (natstest.Cluster,
	// each stream R servers) that replaces the one server ns.
	servers int
	nats    *natstest.Cluster
}

// onNATSCluster runs the cluster's torpor nodes and worker on a NATS
// cluster of n servers, every stream with n replicas.
//
// The nodes' deadline is 30 s there: a command whose answer a dead server
// took with it is answered at its 5 s timeout and retried, and a worker's
// report likewise, which the 5 s of the other fault tests would not leave
// room for (a node extends a deadline for the outages it sees itself, not
// for those its worker saw).
func onNATSCluster(n int) func(*cluster) {
	return func(c *cluster) { c.servers, c.deadline = n, 30*time.Second }
}

// url is the NATS URL the nodes and the worker dial.
func (c *cluster) url() string {
	if c.nats != nil {
		return c.nats.URL()
	}
	return c.ns.ClientURL()
}

// worker is the worker node's `torpor driver`, in this process.
type worker struct {
	cancel context.CancelFunc
	done   chan error
	nc     *nats.Conn // its connection to NATS
}

func newCluster(t *testing.T, instances, driving int, f *faults, opts ...func(*cluster)) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{t: t, authDir: filepath.Join(dir, "auth"), faults: f, driving: driving, deadline: 5 * time.Second, limit: 15 * time.Second}
	for _, o := range opts {
		o(c)
	}
	var err error
	if c.auth, err = busauth.Open(c.authDir, busauth.NoLimits); err != nil {
		t.Fatal(err)
	}
	if c.servers > 0 {
		c.nats = natstest.StartCluster(t, c.servers, c.auth)
	} else {
		if c.ns, err = embedded.Start(embedded.Config{Data: dir, Listen: "127.0.0.1:0", Operator: c.auth.OperatorJWT, Accounts: c.auth.Accounts(), SystemAccount: c.auth.SystemKey, Name: "faults"}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.ns.Shutdown(); c.ns.WaitForShutdown() })
	}
	c.service = c.creds("service", busauth.Grant{Role: busauth.Service})
	// The sim worker reports for its sandboxes (--sim-reports); the process
	// one's supervisors are users of their own sandbox.
	c.driver = c.creds("driver", busauth.Grant{Role: busauth.Driver, Node: "w1", SimReports: !c.process})
	for i := range instances {
		c.nodes = append(c.nodes, c.startNode(i))
	}
	if instances == 0 {
		return c // the bus alone
	}
	c.token = c.nodes[0].AdminToken()
	c.startWorker()
	return c
}

func (c *cluster) creds(name string, g busauth.Grant) string {
	c.t.Helper()
	u, err := c.auth.User(name, time.Hour, g)
	if err != nil {
		c.t.Fatal(err)
	}
	b, err := u.Creds()
	if err != nil {
		c.t.Fatal(err)
	}
	file := filepath.Join(c.t.TempDir(), name+".creds")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		c.t.Fatal(err)
	}
	return file
}

// startNode starts node i, with the bus's keys under its data directory
// (so that it mints its supervisors' users) and the service's credentials.
func (c *cluster) startNode(i int) *Node {
	c.t.Helper()
	data := c.t.TempDir()
	if err := os.CopyFS(filepath.Join(data, "auth"), os.DirFS(c.authDir)); err != nil {
		c.t.Fatal(err)
	}
	cfg := testConfig(c.t, fmt.Sprintf("ctl%d", i+1))
	cfg.Data, cfg.NATSURL, cfg.NATSCreds, cfg.NATSListen = data, c.url(), c.service, ""
	cfg.Replicas = c.servers
	cfg.Deadline, cfg.HeartbeatLimit = c.deadline, c.limit
	if i < c.driving {
		cfg.RemoteNodes = []string{"w1"}
	}
	if c.faults != nil {
		cfg.wrapStore = c.faults.wrap
	}
	n, err := Start(context.Background(), cfg, zerolog.New(zerolog.NewTestWriter(c.t)).Level(zerolog.WarnLevel).With().Str("node", fmt.Sprint(i)).Logger())
	if err != nil {
		c.t.Fatalf("start node %d: %v", i, err)
	}
	c.t.Cleanup(func() { _ = n.Stop() })
	return n
}

// startWorker starts the worker's `torpor driver` (the sim) over its data
// directory, which it keeps across restarts.
func (c *cluster) startWorker() {
	c.t.Helper()
	data := filepath.Join(c.authDir, "..", "w1")
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{cancel: cancel, done: make(chan error, 1)}
	up := make(chan struct{})
	cfg := DriverConfig{Node: "w1", Drivers: []string{"sim"}, NATSURL: c.url(), NATSCreds: c.driver, Data: data, Heartbeat: time.Second}
	cfg.connected = func(nc *nats.Conn) { w.nc = nc } // before up: read after it
	if c.proxied && c.proxy == nil {
		c.proxy = newProxy(c.t, c.ns.Addr().String())
	}
	if c.proxy != nil {
		cfg.NATSURL = "nats://" + c.proxy.Addr()
	}
	if c.process {
		if c.proxy == nil {
			c.proxy = newProxy(c.t, c.ns.Addr().String())
			c.t.Cleanup(func() { deleteProcessSandboxes(c.t, data) })
		}
		cfg.Drivers, cfg.NATSURL, cfg.Torpor, cfg.Heartbeat = []string{"process"}, "nats://"+c.proxy.Addr(), torporBinary(c.t), c.limit/3
	}
	go func() {
		w.done <- RunDriver(ctx, cfg, writerFunc(func(p []byte) { close(up) }), zerolog.Nop())
	}()
	select {
	case <-up:
	case err := <-w.done:
		c.t.Fatalf("worker: %v", err)
	}
	c.worker = w
	c.t.Cleanup(w.stop)
}

func (w *worker) stop() {
	w.cancel()
	<-w.done
	w.done <- nil // for a second stop
}

// crash ends the worker as a killed `torpor driver` would leave it: its
// NATS connection gone at once (the answers in flight lost, nothing
// flushed), then its parts.
func (w *worker) crash() {
	w.nc.Close()
	w.stop()
}

// writerFunc is an io.Writer that calls f once, at its first write.
type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) {
	f(p)
	return len(p), nil
}

// client is an HTTP client of node n, with the first node's admin token
// (the tokens are shared).
func (c *cluster) client(n *Node) *torpor.Client {
	return torpor.New(n.HTTPURL(), nil).WithToken(c.token)
}

// faults make appends through the command service fail once in every:
// before the append (nothing stored) or after it (stored, the answer lost).
type faults struct {
	mu      sync.Mutex
	rng     *rand.Rand
	every   int
	before  atomic.Int64
	after   atomic.Int64
	enabled atomic.Bool
}

func newFaults(seed uint64, every int) *faults {
	f := &faults{rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), every: every}
	f.enabled.Store(true)
	return f
}

func (f *faults) roll() int {
	if !f.enabled.Load() {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rng.IntN(f.every) != 0 {
		return 0
	}
	return 1 + f.rng.IntN(2)
}

func (f *faults) wrap(s events.Store) events.Store { return faultyStore{Store: s, f: f} }

// errInjected is the failure the fault tests inject into an append.
var errInjected = events.Errorf(events.CodeUnavailable, "injected: the append failed")

type faultyStore struct {
	events.Store
	f *faults
}

func (s faultyStore) Append(ctx context.Context, id string, expected uint64, envs ...events.Envelope) (uint64, error) {
	switch s.f.roll() {
	case 1:
		s.f.before.Add(1)
		return 0, errInjected
	case 2:
		if _, err := s.Store.Append(ctx, id, expected, envs...); err != nil {
			return 0, err
		}
		s.f.after.Add(1)
		return 0, errInjected
	}
	return s.Store.Append(ctx, id, expected, envs...)
}

// acked is a command a node answered OK: its sandbox and idempotency key.
type acked struct {
	id, verb, key string
}

// load runs commands against random nodes for every sandbox until each
// has done its cycle: create, suspend, resume, stop, start, and delete for
// some. It returns the commands answered OK.
func (c *cluster) load(t *testing.T, rng *rand.Rand, sandboxes int, during func(i, step int)) ([]acked, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu       sync.Mutex
		out      []acked
		wg       sync.WaitGroup
		complete atomic.Int64
	)
	live := func() *Node {
		c.mu.Lock()
		defer c.mu.Unlock()
		var up []*Node
		for _, n := range c.nodes {
			if n.Conn().IsConnected() {
				up = append(up, n)
			}
		}
		return up[rng.IntN(len(up))]
	}
	for i := range sandboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send := func(verb, id string, f func(cl *torpor.Client, key string) (events.View, error)) (events.View, bool) {
				key := fmt.Sprintf("fault-%d-%s-%d", i, verb, time.Now().UnixNano())
				// Again, same key, for up to 30 s: an instance down, an
				// injected failure, a NATS election.
				var err error
				for end := time.Now().Add(30 * time.Second); time.Now().Before(end) && ctx.Err() == nil; {
					var v events.View
					v, err = f(c.client(live()), key)
					if err == nil {
						mu.Lock()
						out = append(out, acked{id: cmpOr(v.ID, id), verb: verb, key: key})
						mu.Unlock()
						return v, true
					}
					if code := events.CodeOf(err); code == events.CodeFailedPrecondition || code == events.CodeInvalidArgument {
						t.Logf("sandbox %d: %s refused: %v", i, verb, err)
						if h, herr := c.client(live()).History(context.Background(), id, 0); herr == nil {
							for _, e := range h {
								t.Logf("  seq %d %s phase %s actor %s cmd %s time %s", e.Seq, e.Type, e.Phase, e.Actor, e.CommandID, e.Time.Format("15:04:05.000"))
							}
						}
						return v, false
					}
					time.Sleep(50 * time.Millisecond)
				}
				t.Logf("sandbox %d: %s not answered OK in 30 s: %v", i, verb, err)
				return events.View{}, false
			}
			v, ok := send("create", "", func(cl *torpor.Client, key string) (events.View, error) {
				r := torpor.CreateRequest{Driver: "sim", Node: "w1", Labels: map[string]string{"fault": "yes"}, DriverOptions: c.options}
				if c.process {
					r.Driver, r.Command = "process", []string{"sh", "-c", "sleep 600"}
				}
				return cl.Create(ctx, r, key)
			})
			if !ok {
				return
			}
			// again, when set, ends a wait that finds the sandbox back in
			// that phase: the command failed honestly and is sent again.
			var (
				again    events.Phase
				answered uint64 // the sequence the command's answer was at
				failed   bool   // the last wait found the sandbox in again, past answered
			)
			wait := func(p events.Phase) bool {
				failed = false
				var err error
				for ctx.Err() == nil {
					// A node that dies under a wait cuts it: ask another.
					// (The SDK retries a node that went away until the
					// wait's time is up: DEADLINE_EXCEEDED.)
					_, err = c.client(live()).Wait(ctx, v.ID, p, 10*time.Second)
					// Only a view past the command's answer says how it
					// ended (a view lagging behind may still be the one
					// from before it). A wait's DEADLINE_EXCEEDED carries
					// no view: the view is read.
					if again != "" && events.CodeOf(err) == events.CodeDeadlineExceeded {
						if g, gerr := c.client(live()).Get(ctx, v.ID); gerr == nil && g.Phase == again && g.Seq > answered {
							failed = true
							return false
						}
					}
					if code := events.CodeOf(err); err == nil || code != events.CodeUnavailable && code != events.CodeDeadlineExceeded {
						break
					}
				}
				if err != nil {
					t.Logf("sandbox %d: wait for %s: %v", i, p, err)
					if h, herr := c.client(live()).History(context.Background(), v.ID, 0); herr == nil {
						for _, e := range h {
							t.Logf("  seq %d %s phase %s actor %s cmd %s", e.Seq, e.Type, e.Phase, e.Actor, e.CommandID)
						}
					}
				}
				return err == nil
			}
			if !wait(events.PhaseReady) {
				return
			}
			verbs := []string{"suspend", "resume", "stop", "start", "delete"}
			if i%4 == 1 {
				// Deleted while suspended: the retained state is let go.
				verbs = []string{"suspend", "delete"}
			}
			for step, verb := range verbs {
				if verb == "delete" && i%2 == 0 {
					break
				}
				if during != nil {
					during(i, step) // step 0: the sandbox ready; 1: suspended
				}
				want := map[string]events.Phase{"suspend": events.PhaseSuspended, "resume": events.PhaseReady, "stop": events.PhaseStopped, "start": events.PhaseReady, "delete": events.PhaseDeleted}[verb]
				// A resume may fail honestly under faults (its deadline
				// passed while a server recovered; the state is still held
				// and the sandbox suspended), and so may a suspend (its
				// call lost with a crashed worker: its deadline finds the
				// workload running, and the sandbox back in ready): as a
				// user would, the load sends it again, up to three times.
				tries, back := 1, events.Phase("")
				switch verb {
				case "resume":
					tries, back = 3, events.PhaseSuspended
				case "suspend":
					tries, back = 3, events.PhaseReady
				}
				done := false
				for try := 0; try < tries && !done && (try == 0 || failed); try++ {
					a, ok := send(verb, v.ID, func(cl *torpor.Client, key string) (events.View, error) {
						if verb == "resume" {
							return cl.Resume(ctx, v.ID, torpor.ResumeOptions{}, key)
						}
						return cl.Lifecycle(ctx, verb, v.ID, false, key)
					})
					if !ok {
						return
					}
					again, answered = "", a.Seq
					if try < tries-1 {
						again = back
					}
					done = wait(want)
					if failed {
						c.again.Add(1)
						t.Logf("sandbox %d: %s failed honestly (%s again): sent again", i, verb, back)
					}
				}
				if !done {
					return
				}
			}
			complete.Add(1)
		}()
	}
	wg.Wait()
	return out, int(complete.Load())
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// converge waits until no sandbox is in a transient phase, then checks
// what every fault test asks: no acknowledged command lost, the checker
// finds nothing, and every sandbox suspended with its state held resumes.
// It returns how long the sandboxes took to settle.
func (c *cluster) converge(t *testing.T, acks []acked) time.Duration {
	t.Helper()
	ctx := context.Background()
	began := time.Now()
	cl := c.client(c.liveNode())
	var views []events.View
	for {
		views = views[:0]
		cursor := ""
		for {
			page, err := cl.List(ctx, "", "fault=yes", 500, cursor)
			if err != nil {
				t.Fatal(err)
			}
			views = append(views, page.Items...)
			if cursor = page.Next; cursor == "" {
				break
			}
		}
		if !slices.ContainsFunc(views, func(v events.View) bool { return v.Phase.Transient() }) {
			break
		}
		if time.Since(began) > 60*time.Second {
			for _, v := range views {
				if v.Phase.Transient() {
					t.Errorf("sandbox %s still %s after a minute", v.ID, v.Phase)
				}
			}
			t.FailNow()
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Every view catches up with its own log by itself (issue 25: after a
	// NATS server died and came back, views stayed behind).
	for _, v := range views {
		for {
			h, err := cl.History(ctx, v.ID, 0)
			if err != nil {
				t.Fatalf("history of %s: %v", v.ID, err)
			}
			last := h[len(h)-1].Seq
			got, err := cl.Get(ctx, v.ID)
			if err != nil {
				t.Fatalf("view of %s: %v", v.ID, err)
			}
			if got.Seq >= last {
				break
			}
			if time.Since(began) > 90*time.Second {
				t.Fatalf("the view of %s stands at seq %d, its log at %d", v.ID, got.Seq, last)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	settled := time.Since(began)
	for _, a := range acks {
		h, err := cl.History(ctx, a.id, 0)
		if err != nil {
			t.Errorf("history of %s: %v", a.id, err)
			continue
		}
		id := a.id
		if a.verb == gateway.VerbCreate {
			id = ""
		}
		cmd := gateway.CommandID(a.verb, id, a.key)
		if !slices.ContainsFunc(h, func(e torpor.Event) bool { return e.CommandID == cmd }) {
			t.Errorf("%s of %s answered OK (key %s), and the log has no event of it", a.verb, a.id, a.key)
		}
	}
	// No restore reference was let go (discarded, invalidated) while the
	// worker's driver still held the state behind it.
	drv := "sim"
	if c.process {
		drv = "process"
	}
	worker := remote.NewClient(c.liveNode().Conn(), "w1", drv)
	letGo := 0
	defer func() { t.Logf("references let go in the log, each checked against w1: %d", letGo) }()
	for _, v := range views {
		h, err := cl.History(ctx, v.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		var gone []string
		for _, e := range h {
			if e.Type == events.TypeRetainedStateDiscarded || e.Type == events.TypeRetainedStateInvalidated {
				var d struct {
					RestoreRef string `json:"restore_ref"`
				}
				_ = json.Unmarshal(e.Data, &d)
				gone = append(gone, d.RestoreRef)
			}
		}
		if len(gone) == 0 {
			continue
		}
		letGo += len(gone)
		o, err := worker.Observe(ctx, compute.Spec{SandboxID: v.ID, Node: "w1"})
		if err != nil {
			t.Errorf("observe %s on w1: %v", v.ID, err)
			continue
		}
		if o.State == compute.StateFrozen && slices.Contains(gone, o.RestoreRef) {
			t.Errorf("sandbox %s: reference %s let go in the log, and w1 still holds the state behind it", v.ID, o.RestoreRef)
		}
	}
	// The stays and the deadlines' clean-ups are judged too, against
	// the nodes' own deadline, with the slack of torpor check.
	vs, err := check.Replay(ctx, c.liveNode().Store(), check.Options{Deadline: c.deadline, Slack: checkSlack, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Errorf("the log breaks an invariant: %v", v)
	}
	for _, v := range views {
		if v.Phase != events.PhaseSuspended || !v.Restore.Held {
			continue
		}
		if _, err := cl.Resume(ctx, v.ID, torpor.ResumeOptions{}, ""); err != nil {
			t.Errorf("resume of %s, suspended and held: %v", v.ID, err)
			continue
		}
		if _, err := cl.Wait(ctx, v.ID, events.PhaseReady, 30*time.Second); err != nil {
			t.Errorf("%s suspended and held did not resume: %v", v.ID, err)
		}
	}
	return settled
}

// survived logs what a fault test survived, and appends it, one line
// named by the test, to the file TORPOR_FIGURES names when set: go test
// prints no passing test's log, and .ci/run prints that file after the
// suite.
func survived(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	name := os.Getenv("TORPOR_FIGURES")
	if name == "" {
		return
	}
	f, err := os.OpenFile(name, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("TORPOR_FIGURES: %v", err)
		return
	}
	if _, err := fmt.Fprintf(f, "%s: %s\n", t.Name(), line); err != nil {
		t.Errorf("TORPOR_FIGURES: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("TORPOR_FIGURES: %v", err)
	}
}

// checkSlack is how far past the nodes' deadline converge lets a
// transient stay, or a deadline's clean-up, go before the checker reports
// it: torpor check's default (--slack).
const checkSlack = 10 * time.Second

// liveNode is a node still connected.
func (c *cluster) liveNode() *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Conn().IsConnected() {
			return n
		}
	}
	c.t.Fatal("no node left")
	return nil
}

// seed is CHAOS_SEED, else a fixed one (printed, to run a failure again).
func seed(t *testing.T) uint64 {
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED %q: %v", s, err)
		}
		return n
	}
	return 1
}

// TestFaultAppendsFailOnce: three nodes, one append in ten through any of
// them fails once (half before the append, half after it with the answer
// lost); commands go to random nodes, and clients retry with their key.
func TestFaultAppendsFailOnce(t *testing.T) {
	s := seed(t)
	f := newFaults(s, 10)
	c := newCluster(t, 3, 3, f)
	rng := rand.New(rand.NewPCG(s, 1))
	const sandboxes = 12
	acks, complete := c.load(t, rng, sandboxes, nil)
	f.enabled.Store(false)
	settled := c.converge(t, acks)
	survived(t, "survived (seed %d): %d commands answered OK, %d of %d sandboxes through their cycle; %d appends failed before, %d after storing; settled in %s",
		s, len(acks), complete, sandboxes, f.before.Load(), f.after.Load(), settled.Round(time.Millisecond))
	if f.before.Load()+f.after.Load() == 0 {
		t.Error("no fault was injected")
	}
	if complete != sandboxes {
		t.Errorf("%d of %d sandboxes went through their cycle", complete, sandboxes)
	}
}

var _ = errors.New

// crash ends n as a killed process would leave it: its NATS connection
// gone at once (nothing flushed, nothing released), then its parts.
func crash(n *Node) {
	n.nc.Close()
	_ = n.Stop()
}

// watch calls f, in a goroutine of its own, with each request the nodes
// send to the worker's drivers for op, as the bus carries it (on a
// service connection of its own), until the test ends.
func (c *cluster) watch(op string, f func(remote.Request)) {
	c.t.Helper()
	nc := c.watcher()
	if _, err := nc.Subscribe(remote.Subject("w1", op), func(m *nats.Msg) {
		var req remote.Request
		if err := json.Unmarshal(m.Data, &req); err == nil {
			go f(req)
		}
	}); err != nil {
		c.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		c.t.Fatal(err)
	}
}

// watcher is a service connection of the test's own, to NATS directly.
func (c *cluster) watcher() *nats.Conn {
	c.t.Helper()
	// The service's inbox: the worker answers no other.
	nc, err := nats.Connect(c.url(), nats.UserCredentials(c.service), nats.CustomInboxPrefix(busauth.ServiceInbox), nats.Name("fault test"), nats.MaxReconnects(-1))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// effect waits, up to a second, until the worker observes done of the
// sandbox of spec: the call's effect done, its answer not yet sent (the
// sim holds it for inFlight). It says whether it saw it.
func (c *cluster) effect(nc *nats.Conn, spec compute.Spec, done func(compute.Observation) bool) bool {
	w := remote.NewClient(nc, "w1", "sim", remote.WithTimeout(time.Second))
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if o, err := w.Observe(context.Background(), spec); err == nil && done(o) {
			return true
		}
	}
	return false
}

// inFlight is how long the sim holds each answer after its effect is done
// in the tests that crash something mid-call: a crash as a request is on
// the bus lands before its answer.
const inFlight = "500ms"

// holder is the node that holds the lease of w1's sagas (the one whose
// runner drives the worker's sandboxes), or nil when the lease names none
// of the nodes still connected (its holder died, and nobody took it over
// yet).
func (c *cluster) holder(nc *nats.Conn) *Node {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil
	}
	kv, err := js.KeyValue(ctx, jsstore.LeaseBucket)
	if err != nil {
		return nil
	}
	e, err := kv.Get(ctx, sagas.PositionKey("w1"))
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Conn().IsConnected() && string(e.Value()) == leaseHolder(n.data) {
			return n
		}
	}
	return nil
}

// TestFaultNodeKilled: three nodes; while sandboxes suspend and resume
// through random nodes, the node that holds the lease of the worker's
// sagas is killed twice, spaced apart: mid-suspend (a suspend on the bus,
// its effect done, its answer held back by the sim), and, once another
// node took the lease over, mid-resume likewise. The node left finishes
// what they left.
func TestFaultNodeKilled(t *testing.T) {
	s := seed(t)
	c := newCluster(t, 3, 3, nil, func(c *cluster) { c.options = map[string]string{"answer_delay": inFlight} })
	rng := rand.New(rand.NewPCG(s, 2))
	nc := c.watcher()
	type kill struct {
		op       string
		node     string
		effect   bool          // the call's effect was done when the node died
		takeover time.Duration // until a live node held the lease again
	}
	var (
		mu    sync.Mutex
		kills []kill
		armed = map[string]bool{"suspend": true} // the resume's kill is armed by the first takeover
		both  = make(chan struct{})
	)
	// killMid kills w1's lease holder at the first request for op once
	// armed, as soon as the worker observes the call's effect (done).
	killMid := func(op string, done func(remote.Request) (compute.Spec, func(compute.Observation) bool)) func(remote.Request) {
		return func(req remote.Request) {
			mu.Lock()
			if !armed[op] {
				mu.Unlock()
				return
			}
			armed[op] = false
			mu.Unlock()
			n := c.holder(nc)
			if n == nil {
				t.Errorf("a %s on the bus, and no live node holds w1's lease", op)
				return
			}
			spec, ok := done(req)
			k := kill{op: op, node: n.Name(), effect: c.effect(nc, spec, ok)}
			began := time.Now()
			crash(n)
			for time.Since(began) < 30*time.Second {
				if c.holder(nc) != nil {
					k.takeover = time.Since(began)
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			kills = append(kills, k)
			if op == "suspend" {
				armed["resume"] = true
			} else {
				close(both)
			}
		}
	}
	c.watch("suspend", killMid("suspend", func(req remote.Request) (compute.Spec, func(compute.Observation) bool) {
		return req.Target.Spec, func(o compute.Observation) bool {
			return o.State == compute.StateFrozen && o.Generation == req.Target.Generation
		}
	}))
	c.watch("resume", killMid("resume", func(req remote.Request) (compute.Spec, func(compute.Observation) bool) {
		return req.Resume.Spec, func(o compute.Observation) bool {
			return o.State == compute.StateRunning && o.Generation == req.Resume.Generation
		}
	}))
	const sandboxes = 12
	acks, complete := c.load(t, rng, sandboxes, nil)
	select {
	case <-both:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("nodes killed: %+v; want one mid-suspend, then one mid-resume", kills)
	}
	settled := c.converge(t, acks)
	mu.Lock()
	defer mu.Unlock()
	var what []string
	for _, k := range kills {
		what = append(what, fmt.Sprintf("%s (w1's lease holder) mid-%s, its effect done: %t, the lease taken over in %s", k.node, k.op, k.effect, k.takeover.Round(time.Millisecond)))
	}
	survived(t, "survived (seed %d): %d commands answered OK, %d of %d sandboxes through their cycle; killed %s; %d commands failed honestly and were sent again; settled in %s",
		s, len(acks), complete, sandboxes, strings.Join(what, ", then "), c.again.Load(), settled.Round(time.Millisecond))
	if complete != sandboxes {
		t.Errorf("%d of %d sandboxes went through their cycle", complete, sandboxes)
	}
	for _, k := range kills {
		if k.takeover == 0 {
			t.Errorf("nobody took w1's lease over after %s died", k.node)
		}
	}
}

// TestFaultWorkerRestarted: the worker's `torpor driver` crashes (its NATS
// connection closed first, as a killed process's) while a suspend's answer
// is in flight, as sandboxes go through their cycle, and starts again on
// the same data a second later; the sagas ride it out.
func TestFaultWorkerRestarted(t *testing.T) {
	s := seed(t)
	c := newCluster(t, 3, 3, nil, func(c *cluster) { c.options = map[string]string{"answer_delay": inFlight} })
	rng := rand.New(rand.NewPCG(s, 3))
	var once sync.Once
	crashed := make(chan struct{})
	var frozen bool // the suspend's effect was done when the worker crashed
	nc := c.watcher()
	c.watch("suspend", func(req remote.Request) {
		once.Do(func() {
			defer close(crashed)
			frozen = c.effect(nc, req.Target.Spec, func(o compute.Observation) bool {
				return o.State == compute.StateFrozen && o.Generation == req.Target.Generation
			})
			c.worker.crash()
			time.Sleep(time.Second) // the worker is away for this long
			c.startWorker()
		})
	})
	const sandboxes = 12
	acks, complete := c.load(t, rng, sandboxes, nil)
	select {
	case <-crashed:
	case <-time.After(30 * time.Second):
		t.Fatal("no suspend went out: the worker never crashed")
	}
	settled := c.converge(t, acks)
	survived(t, "survived (seed %d): %d commands answered OK, %d of %d sandboxes through their cycle; the worker crashed once, a suspend's answer in flight (its effect done: %t), and restarted; %d commands failed honestly and were sent again; settled in %s",
		s, len(acks), complete, sandboxes, frozen, c.again.Load(), settled.Round(time.Millisecond))
	if complete != sandboxes {
		t.Errorf("%d of %d sandboxes went through their cycle", complete, sandboxes)
	}
}

// newProxy is a proxy to the NATS server at target, closed with the test:
// cut, it partitions the worker behind it.
func newProxy(t *testing.T, target string) *natstest.Proxy {
	t.Helper()
	p, err := natstest.NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// torporBinary is the torpor binary the process driver's supervisors run,
// built once for the test binary.
var torporBinary = func() func(t *testing.T) string {
	var (
		once sync.Once
		path string
		err  error
	)
	return func(t *testing.T) string {
		t.Helper()
		once.Do(func() {
			dir, derr := os.MkdirTemp("", "torpor-node-test-")
			if derr != nil {
				err = derr
				return
			}
			path = filepath.Join(dir, "torpor")
			if out, berr := exec.Command("go", "build", "-o", path, "github.com/torpor/torpor/cmd/torpor").CombinedOutput(); berr != nil {
				err = fmt.Errorf("go build: %v\n%s", berr, out)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
}()

// deleteProcessSandboxes ends every process sandbox under dir (the
// workloads a test leaves running).
func deleteProcessSandboxes(t *testing.T, dir string) {
	d, err := process.New(process.Config{Data: dir, NATSURL: "nats://127.0.0.1:1"})
	if err != nil {
		t.Error(err)
		return
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "process"))
	for _, e := range entries {
		if err := d.Delete(context.Background(), compute.Spec{SandboxID: e.Name()}); err != nil {
			t.Errorf("delete %s: %v", e.Name(), err)
		}
	}
}

// TestFaultWorkerCutOff: the worker (the process driver, its supervisors
// beating every third of the heartbeat limit) reaches NATS through a proxy
// that cuts it off for twice the heartbeat limit while sandboxes go
// through their cycle, then heals: its supervisors are recorded detached
// and attach again, and every cycle completes.
func TestFaultWorkerCutOff(t *testing.T) {
	s := seed(t)
	c := newCluster(t, 3, 3, nil, func(c *cluster) {
		c.process, c.deadline, c.limit = true, 15*time.Second, time.Second
	})
	rng := rand.New(rand.NewPCG(s, 4))
	var once sync.Once
	var cut time.Duration
	var ready atomic.Int64
	var cutConns int
	const sandboxes = 6
	acks, complete := c.load(t, rng, sandboxes, func(i, step int) {
		if step != 0 {
			return
		}
		// Once every sandbox is ready (or 30 s passed), the worker is cut
		// off while they are: their supervisors' beats stop.
		ready.Add(1)
		for end := time.Now().Add(30 * time.Second); ready.Load() < sandboxes && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
		once.Do(func() {
			// Right after the attaches: a supervisor that beats is
			// watched from its attach (compute.Report.Beats), not from
			// its first beat.
			cut = 2 * c.limit
			cutConns, _, _ = c.proxy.Stats()
			c.proxy.Cut()
			time.Sleep(cut) // the partition lasts this long
			c.proxy.Heal()
			// Detached meanwhile, the supervisors attach again: the
			// sandboxes go on once none is provisioning.
			for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				page, err := c.client(c.liveNode()).List(context.Background(), string(events.PhaseProvisioning), "fault=yes", 0, "")
				if err == nil && len(page.Items) == 0 {
					break
				}
			}
		})
	})
	settled := c.converge(t, acks)
	detached, reattached := 0, 0
	for _, a := range acks {
		if a.verb != gateway.VerbCreate {
			continue
		}
		h, err := c.client(c.liveNode()).History(context.Background(), a.id, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range h {
			if e.Type == events.TypeSupervisorDetached {
				detached++
				if slices.ContainsFunc(h[i:], func(e torpor.Event) bool { return e.Type == events.TypeSupervisorAttached }) {
					reattached++
				}
			}
		}
	}
	_, _, refused := c.proxy.Stats()
	survived(t, "survived (seed %d): %d commands answered OK, %d of %d sandboxes through their cycle; the worker cut off for %s (%d connections through the proxy cut, %d tried again while cut); %d detaches, %d attached again; settled in %s",
		s, len(acks), complete, sandboxes, cut, cutConns/2, refused, detached, reattached, settled.Round(time.Millisecond))
	if complete != sandboxes {
		t.Errorf("%d of %d sandboxes went through their cycle", complete, sandboxes)
	}
	// The driver and every supervisor were behind the proxy when it cut.
	if cutConns/2 < sandboxes+1 {
		t.Errorf("%d connections cut, want the driver's and %d supervisors'", cutConns/2, sandboxes)
	}
	if detached == 0 || reattached != detached {
		t.Errorf("%d supervisors recorded detached, %d of them attached again: want every one cut off detached, and attached again", detached, reattached)
	}
}

// TestFaultChaos: every fault at once, at random (CHAOS_SEED), for
// CHAOS_DURATION (default 60s: about a minute in CI, as issue 24 asks;
// longer by env): appends failing once in ten, nodes killed
// and replaced by fresh ones, the worker's driver restarted, the worker
// cut off from NATS for a moment, while rounds of sandboxes go through
// their cycle. Then everything must settle as in the tests above.
func TestFaultChaos(t *testing.T) {
	s := seed(t)
	duration := time.Minute
	if d := os.Getenv("CHAOS_DURATION"); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("CHAOS_DURATION %q: %v", d, err)
		}
	}
	f := newFaults(s, 10)
	c := newCluster(t, 3, 3, f, func(c *cluster) { c.proxied = true })
	rng := rand.New(rand.NewPCG(s, 5))
	chaos := rand.New(rand.NewPCG(s, 6))
	var kills, restarts, cuts int
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The kinds of fault take turns from a random first one, at
		// random moments, so that a run of any length meets each.
		kind := chaos.IntN(3)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(1000+chaos.IntN(2000)) * time.Millisecond):
			}
			kind = (kind + 1) % 3
			switch kind {
			case 0: // kill a node and start a fresh one in its place
				c.mu.Lock()
				i := chaos.IntN(len(c.nodes))
				old := c.nodes[i]
				c.mu.Unlock()
				old.nc.Close() // dead from here on; its parts stop meanwhile
				go crash(old)
				fresh := c.startNode(i)
				c.mu.Lock()
				c.nodes[i] = fresh
				c.mu.Unlock()
				kills++
			case 1:
				c.worker.stop()
				time.Sleep(time.Duration(chaos.IntN(1000)) * time.Millisecond)
				c.startWorker()
				restarts++
			case 2:
				c.proxy.Cut()
				time.Sleep(time.Duration(200+chaos.IntN(1000)) * time.Millisecond)
				c.proxy.Heal()
				cuts++
			}
		}
	}()
	var acks []acked
	rounds, complete, started := 0, 0, 0
	for end := time.Now().Add(duration); time.Now().Before(end); rounds++ {
		a, n := c.load(t, rng, 8, nil)
		acks, complete, started = append(acks, a...), complete+n, started+8
	}
	close(stop)
	<-done
	f.enabled.Store(false)
	settled := c.converge(t, acks)
	survived(t, "survived (seed %d, %s): %d rounds, %d commands answered OK, %d of %d sandboxes through their cycle; %d appends failed before, %d after storing; %d nodes killed and replaced, %d worker restarts, %d cuts; settled in %s",
		s, duration, rounds, len(acks), complete, started, f.before.Load(), f.after.Load(), kills, restarts, cuts, settled.Round(time.Millisecond))
	if complete < started*9/10 {
		t.Errorf("%d of %d sandboxes went through their cycle, want nine in ten at least", complete, started)
	}
}

// TestSurvivedAppendsToFigures: each fault test's figures go to the file
// TORPOR_FIGURES names, one line each, after what is there.
func TestSurvivedAppendsToFigures(t *testing.T) {
	file := filepath.Join(t.TempDir(), "figures")
	if err := os.WriteFile(file, []byte("before\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TORPOR_FIGURES", file)
	t.Run("a", func(t *testing.T) { survived(t, "survived %d faults", 3) })
	t.Run("b", func(t *testing.T) { survived(t, "survived %s", "a cut") })
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := "before\nTestSurvivedAppendsToFigures/a: survived 3 faults\nTestSurvivedAppendsToFigures/b: survived a cut\n"
	if string(got) != want {
		t.Errorf("figures file:\n%s\nwant:\n%s", got, want)
	}
}
