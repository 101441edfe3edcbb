package drivertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
)

// Gateway answers supervisor reports on torpor.supervisor.* of a real
// nats-server as the gateway does: a report with a wrong credential is
// refused (UNAUTHENTICATED), one of an older generation than the newest
// attached is fenced (FAILED_PRECONDITION); a report taken goes to its
// sandbox's channel, and to all.
type Gateway struct {
	// URL is the NATS server's; All receives every report taken.
	URL string
	// Wait bounds Await; 0 is Timeout.
	Wait time.Duration
	// JS is the server's JetStream (the object store of the vm driver's snapshots, say).
	JS     jetstream.JetStream
	All    chan compute.Report
	nc     *nats.Conn
	handle nats.MsgHandler

	mu     sync.Mutex
	boxes  map[string]chan compute.Report
	newest map[string]int64
	// received is every report each sandbox's supervisors sent, taken or not.
	received map[string][]compute.Report
	sub      *nats.Subscription // nil while down
	// failOnce is the code the next report of a kind is answered with.
	failOnce map[string]events.Code
	// detached are the sandboxes whose heartbeats are refused until an
	// attach is taken.
	detached map[string]bool
}

// FailOnce answers the next report of kind with code, not taking it (a
// gateway whose append failed, say).
func (g *Gateway) FailOnce(kind string, code events.Code) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failOnce[kind] = code
}

// Detach refuses sandbox id's heartbeats (FAILED_PRECONDITION), as the
// gateway does once it recorded the supervisor detached, until an attach
// of it is taken.
func (g *Gateway) Detach(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.detached[id] = true
}

func NewGateway(t testing.TB) *Gateway {
	t.Helper()
	srv := natstest.StartWith(t, natstest.Options{Listen: true})
	g := &Gateway{URL: srv.ClientURL(), All: make(chan compute.Report, 4096), boxes: map[string]chan compute.Report{}, newest: map[string]int64{}, received: map[string][]compute.Report{},
		failOnce: map[string]events.Code{}, detached: map[string]bool{}}
	g.nc, g.JS = srv.Conn, srv.JS
	g.handle = func(m *nats.Msg) {
		var r compute.Report
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Errorf("a report that is no JSON: %q", m.Data)
			return
		}
		body, _ := json.Marshal(g.Take(r))
		_ = m.Respond(body)
	}
	g.Up(t)
	t.Cleanup(g.Down)
	return g
}

// Up starts answering reports (again).
func (g *Gateway) Up(t testing.TB) {
	t.Helper()
	sub, err := g.nc.Subscribe(compute.ReportSubject("*"), g.handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.sub = sub
	g.mu.Unlock()
}

// Down stops answering reports, as a service that is down does not.
func (g *Gateway) Down() {
	g.mu.Lock()
	sub := g.sub
	g.sub = nil
	g.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
		_ = g.nc.Flush()
	}
}

// Take judges r as the gateway would and returns the answer's body.
func (g *Gateway) Take(r compute.Report) any {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.received[r.SandboxID] = append(g.received[r.SandboxID], r)
	if code, ok := g.failOnce[r.Kind]; ok {
		delete(g.failOnce, r.Kind)
		return events.ErrorBody{Error: events.Errorf(code, "failed once")}
	}
	switch {
	case r.Credential != Cred(r.Generation):
		return events.ErrorBody{Error: events.Errorf(events.CodeUnauthenticated, "bad credential")}
	case r.Generation < g.newest[r.SandboxID]:
		return events.ErrorBody{Error: events.Errorf(events.CodeFailedPrecondition, "generation %d is fenced", r.Generation)}
	case r.Kind == compute.ReportHeartbeat && g.detached[r.SandboxID]:
		return events.ErrorBody{Error: events.Errorf(events.CodeFailedPrecondition, "generation %d is not the attached one", r.Generation)}
	}
	if r.Kind == compute.ReportAttached {
		g.newest[r.SandboxID] = r.Generation
		delete(g.detached, r.SandboxID)
	}
	g.box(r.SandboxID) <- r
	select {
	case g.All <- r:
	default: // a test that does not read all
	}
	return map[string]bool{"ok": true}
}

// Sent is every report sandbox id's supervisors sent so far, taken or not.
func (g *Gateway) Sent(id string) []compute.Report {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]compute.Report(nil), g.received[id]...)
}

// box is sandbox id's channel of reports taken; g.mu is held.
func (g *Gateway) box(id string) chan compute.Report {
	ch := g.boxes[id]
	if ch == nil {
		ch = make(chan compute.Report, 4096)
		g.boxes[id] = ch
	}
	return ch
}

// Await returns the next report taken of sandbox id of kind at gen, passing
// over others (heartbeats, say); it fails the test after wait.
func (g *Gateway) Await(t testing.TB, id, kind string, gen int64) compute.Report {
	t.Helper()
	g.mu.Lock()
	ch := g.box(id)
	g.mu.Unlock()
	wait := g.Wait
	if wait == 0 {
		wait = Timeout
	}
	timeout := time.After(wait)
	for {
		select {
		case r := <-ch:
			if r.Kind == kind && r.Generation == gen {
				return r
			}
		case <-timeout:
			t.Fatalf("no %s report of generation %d of %s in %s", kind, gen, id, wait)
		}
	}
}

// ProcessesNaming lists the live processes whose command line holds s.
func ProcessesNaming(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if strings.Contains(Cmdline(pid), s) && !zombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Cmdline is the command line of pid, its words joined by spaces.
func Cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// Alive says whether pid runs (not a zombie).
func Alive(pid int) bool { return pid > 0 && !zombie(pid) }
