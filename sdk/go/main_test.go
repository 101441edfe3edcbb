package torpor_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/internal/busauth"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/node"
)

// server is the real service every test of the package talks to, a node
// started once in TestMain, in this process.
var server struct {
	http string // host:port
	nats string // nats://host:port
	// token is the admin token the node wrote under its data directory.
	token string
	// creds is a credentials file of a producer and dashboard of its
	// NATS (what `torpor creds` writes), what a bus client connects with.
	creds string
	// service is the service's credentials file, for the tests that do
	// what only torpor itself may (make a bucket, ask of one that is not
	// there).
	service string
}

// waitFor bounds every wait of the tests.
const waitFor = 20 * time.Second

// The node and deadline the test server runs with (not serve's defaults),
// for what it says of itself (TestHTTPVerbs).
const (
	serveNode     = "sdk-node"
	serveDeadline = 45 * time.Second
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "torpor-sdk-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The service in this process, as serve runs it (services/node).
	n, err := node.Start(context.Background(), node.Config{Data: filepath.Join(dir, "data"), HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0",
		Fsync: "interval", Node: serveNode, Deadline: serveDeadline, DuplicateWindow: jsstore.DefaultDuplicateWindow,
		HeartbeatLimit: 15 * time.Second, TokenLimits: node.DefaultTokenLimits, HTTPTimeouts: node.DefaultHTTPTimeouts}, zerolog.Nop())
	if err != nil {
		fmt.Fprintf(os.Stderr, "start the node: %v\n", err)
		return 1
	}
	defer func() { _ = n.Stop() }()
	server.http, server.nats, server.token = n.HTTPAddr(), n.NATSURL(), n.AdminToken()
	server.creds, server.service = filepath.Join(dir, "client.creds"), filepath.Join(dir, "service.creds")
	for file, grants := range map[string][]busauth.Grant{
		server.creds:   {{Role: busauth.Producer}, {Role: busauth.Dashboard}},
		server.service: {{Role: busauth.Service}},
	} {
		u, err := n.Auth().User(filepath.Base(file), 0, grants...)
		if err == nil {
			var creds []byte
			if creds, err = u.Creds(); err == nil {
				err = os.WriteFile(file, creds, 0o600)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "credentials %s: %v\n", file, err)
			return 1
		}
	}
	code := m.Run()
	// The independent checker over the log every test wrote, as
	// cmd/torpor's startApp runs it, stays and clean-ups judged against
	// the server's deadline too: a violation fails the run.
	vs, err := check.Replay(context.Background(), n.Store(), check.Options{Deadline: serveDeadline, Slack: 10 * time.Second, Now: time.Now()})
	if err != nil {
		fmt.Fprintf(os.Stderr, "check the log: %v\n", err)
		return 1
	}
	for _, v := range vs {
		fmt.Fprintf(os.Stderr, "the log breaks an invariant: %v\n", v)
	}
	if len(vs) > 0 && code == 0 {
		code = 1
	}
	return code
}

// client is an HTTP client of the server, straight (no proxy).
func client() *torpor.Client { return torpor.New(server.http, nil).WithToken(server.token) }

// ctxFor is a context bounded by waitFor, ended at the test's cleanup.
func ctxFor(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

// proxy is a TCP proxy to a target address whose connections a test can
// cut all at once, as a network that drops them would.
type proxy struct {
	ln       net.Listener
	target   string
	mu       sync.Mutex
	conns    []net.Conn
	accepted int
	drop     []byte // an answer holding it is dropped (dropAnswer)
	dropped  int
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.accepted++
		p.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); _ = out.Close(); _ = in.Close() }()
		go func() { p.answers(in, out); _ = in.Close(); _ = out.Close() }()
	}
}

// answers copies what the target sends to the client, unless an answer
// with the armed pattern comes: then it cuts every connection instead of
// passing it on (once).
func (p *proxy) answers(in, out net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := out.Read(buf)
		if n > 0 {
			p.mu.Lock()
			drop := p.drop != nil && bytes.Contains(buf[:n], p.drop)
			if drop {
				p.drop = nil
				p.dropped++
			}
			p.mu.Unlock()
			if drop {
				p.cut()
				return
			}
			if _, werr := in.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// dropAnswer arms the proxy: the next read from the target that holds
// pattern is not passed on, and every connection is cut then.
func (p *proxy) dropAnswer(pattern string) {
	p.mu.Lock()
	p.drop = []byte(pattern)
	p.mu.Unlock()
}

// answersDropped is how many answers the proxy dropped.
func (p *proxy) answersDropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// cut closes every connection proxied so far.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// connections is how many connections the proxy has accepted.
func (p *proxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// sim is a create request of the sim driver with its options.
func sim(opts ...string) torpor.CreateRequest {
	r := torpor.CreateRequest{Driver: "sim", DriverOptions: map[string]string{}}
	for i := 0; i+1 < len(opts); i += 2 {
		r.DriverOptions[opts[i]] = opts[i+1]
	}
	return r
}

// recorder collects what a Watch delivers.
type recorder struct {
	mu    sync.Mutex
	views []events.View
	ch    chan struct{} // signalled on each delivery
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) fn(v events.View) error {
	r.mu.Lock()
	r.views = append(r.views, v)
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
	return nil
}

func (r *recorder) snapshot() []events.View {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]events.View(nil), r.views...)
}

// until waits for a delivery of sandbox id at a seq of at least seq.
func (r *recorder) until(t *testing.T, ctx context.Context, id string, seq uint64) {
	t.Helper()
	for {
		for _, v := range r.snapshot() {
			if v.ID == id && v.Seq >= seq {
				return
			}
		}
		select {
		case <-r.ch:
		case <-ctx.Done():
			t.Fatalf("the watch never delivered %s at seq %d or above", id, seq)
		}
	}
}

// checkOnceInOrder asserts that the deliveries of each sandbox are in
// strictly rising seq order (so none twice) and that each of want (id →
// seq, views known to have been stored) was delivered.
func checkOnceInOrder(t *testing.T, views []events.View, want map[string]uint64) {
	t.Helper()
	last := map[string]uint64{}
	got := map[string]map[uint64]bool{}
	for _, v := range views {
		if v.Seq <= last[v.ID] {
			t.Errorf("sandbox %s: seq %d delivered after seq %d (twice or out of order)", v.ID, v.Seq, last[v.ID])
		}
		last[v.ID] = v.Seq
		if got[v.ID] == nil {
			got[v.ID] = map[uint64]bool{}
		}
		got[v.ID][v.Seq] = true
	}
	for id, seq := range want {
		if !got[id][seq] {
			t.Errorf("sandbox %s: its view at seq %d was never delivered", id, seq)
		}
	}
}
