package forward_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/forward"
)

// sandboxes is a hand-written Sandboxes: phases set by the test, ports
// that are real listeners of the test.
type sandboxes struct {
	mu     sync.Mutex
	phase  map[string]events.Phase
	closed map[string]bool // forward ids
	ports  map[int]string  // port → address of a real listener
}

func (s *sandboxes) set(id string, p events.Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase[id] = p
}

func (s *sandboxes) Phase(_ context.Context, id, fid string) (events.Phase, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.phase[id]
	if !ok {
		return "", false, events.Errorf(events.CodeNotFound, "sandbox %s not found", id)
	}
	return p, !s.closed[fid], nil
}

func (s *sandboxes) Dial(ctx context.Context, _ string, port int) (net.Conn, error) {
	s.mu.Lock()
	addr, ok := s.ports[port]
	s.mu.Unlock()
	if !ok {
		return nil, errors.New("connection refused")
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// echo listens on a real port and answers every line with "echo: line".
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					_, _ = io.WriteString(c, "echo: "+sc.Text()+"\n")
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func newForwarder(t *testing.T, idx forward.Index) (*forward.Forwarder, *sandboxes) {
	t.Helper()
	sb := &sandboxes{phase: map[string]events.Phase{}, closed: map[string]bool{}, ports: map[int]string{8000: echo(t)}}
	f := forward.New(sb, idx, forward.Config{Hold: 300 * time.Millisecond, Poll: 10 * time.Millisecond, Sweep: 20 * time.Millisecond}, zerolog.Nop())
	t.Cleanup(f.Shut)
	return f, sb
}

func kvIndex(t *testing.T) *forward.KVIndex {
	t.Helper()
	idx, err := forward.NewKVIndex(context.Background(), natstest.Start(t).JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

// say sends a line through the forward at addr and returns the first line
// that comes back.
func say(t *testing.T, addr, line string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && got == "" {
		t.Fatalf("read through the forward: %v", err)
	}
	return strings.TrimSpace(got)
}

// TestForwardCarriesTraffic: a bound forward carries a connection to the
// sandbox's port while it runs; a port nobody listens on is refused at Bind.
func TestForwardCarriesTraffic(t *testing.T) {
	f, sb := newForwarder(t, kvIndex(t))
	sb.set("s1", events.PhaseReady)
	ctx := context.Background()
	if _, err := f.Bind(ctx, "s1", "fw-0", "127.0.0.1:0", 9999, true); !errors.Is(err, forward.ErrNothingListens) {
		t.Fatalf("bind to a port nobody listens on: %v, want ErrNothingListens", err)
	}
	addr, err := f.Bind(ctx, "s1", "fw-1", "127.0.0.1:0", 8000, true)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := f.Bind(ctx, "s1", "fw-1", "127.0.0.1:0", 8000, true); err != nil || again != addr {
		t.Fatalf("a second bind of the forward: %s, %v; want %s", again, err, addr)
	}
	f.Serve("fw-1")
	if got := say(t, addr, "hello"); got != "echo: hello" {
		t.Fatalf("through the forward: %q", got)
	}
}

// TestForwardHoldsWhileSuspended: a connection to a suspended sandbox waits
// for it; one that waits past the hold is refused with a line that says
// why; the forward carries traffic again once the sandbox runs.
func TestForwardHoldsWhileSuspended(t *testing.T) {
	f, sb := newForwarder(t, kvIndex(t))
	ctx := context.Background()
	sb.set("s1", events.PhaseReady)
	addr, err := f.Bind(ctx, "s1", "fw-1", "127.0.0.1:0", 8000, true)
	if err != nil {
		t.Fatal(err)
	}
	f.Serve("fw-1")
	sb.set("s1", events.PhaseSuspended)
	if got := say(t, addr, "anyone?"); got != "torpor: sandbox s1 is suspended; the connection is refused" {
		t.Fatalf("while suspended past the hold: %q", got)
	}
	// Resumed while a connection waits: it is carried.
	done := make(chan string, 1)
	go func() { done <- say(t, addr, "waited") }()
	time.Sleep(50 * time.Millisecond) // the connection is held meanwhile
	sb.set("s1", events.PhaseReady)
	if got := <-done; got != "echo: waited" {
		t.Fatalf("held across the resume: %q", got)
	}
	sb.set("s1", events.PhaseStopped)
	if got := say(t, addr, "stopped?"); got != "torpor: sandbox s1 is stopped; the connection is refused" {
		t.Fatalf("while stopped: %q", got)
	}
}

// TestForwardSurvivesARestart: the index keeps the forwards served; a new
// forwarder (a restarted service) binds again, at the same address, those
// whose sandbox still has them open, drops the others from the index, and
// Run closes one closed meanwhile.
func TestForwardSurvivesARestart(t *testing.T) {
	idx := kvIndex(t)
	f, sb := newForwarder(t, idx)
	ctx := context.Background()
	sb.set("s1", events.PhaseReady)
	sb.set("gone", events.PhaseDeleted)
	kept, err := f.Bind(ctx, "s1", "fw-kept", "127.0.0.1:0", 8000, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Bind(ctx, "gone", "fw-gone", "127.0.0.1:0", 8000, true); err != nil {
		t.Fatal(err)
	}
	f.Shut() // the service stops: the index keeps both

	g, sb2 := newForwarder(t, idx)
	sb2.set("s1", events.PhaseSuspended) // restored without dialling it
	sb2.set("gone", events.PhaseDeleted)
	if n, err := g.Restore(ctx); err != nil || n != 1 {
		t.Fatalf("restore: %d, %v; want the one forward still open", n, err)
	}
	if addr, ok := g.Address("fw-kept"); !ok || addr != kept {
		t.Fatalf("restored at %q (%v), want %s", addr, ok, kept)
	}
	all, err := idx.All(ctx)
	if err != nil || len(all) != 1 || all["fw-kept"].Address != kept {
		t.Fatalf("index after the restore: %v, %v; want the kept forward only", all, err)
	}
	sb2.set("s1", events.PhaseReady)
	if got := say(t, kept, "back"); got != "echo: back" {
		t.Fatalf("after the restart: %q", got)
	}
	// Closed elsewhere: the sweep closes it here too, and forgets it.
	sb2.mu.Lock()
	sb2.closed["fw-kept"] = true
	sb2.mu.Unlock()
	ctx2, cancel := context.WithCancel(ctx)
	defer cancel()
	go g.Run(ctx2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := g.Address("fw-kept"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a forward closed elsewhere was not swept")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if all, _ := idx.All(ctx); len(all) != 0 {
		t.Fatalf("index after the sweep: %v", all)
	}
}

// active is a Sandboxes that is also an Activity: it records what the
// forwarder reports.
type active struct {
	*sandboxes
	reports chan report
}

type report struct {
	id string
	at time.Time
}

func (a *active) Active(_ context.Context, id string, at time.Time) error {
	a.reports <- report{id, at}
	return nil
}

// clock is a settable time.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// listen serves each connection with serve on a real port and returns its
// address.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestForwardReportsActivityOncePerWindow: bytes through the forwards of a
// sandbox, either way, are reported once per activity window however many
// there are and over however many forwards and connections: many lines
// echoed, a greeting the sandbox sends unasked, bytes it only takes; after
// the window, the next bytes are reported again. Another sandbox's bytes
// are its own.
func TestForwardReportsActivityOncePerWindow(t *testing.T) {
	greet := listen(t, func(c net.Conn) { _, _ = io.WriteString(c, "hello\n") })
	sink := listen(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	sb := &sandboxes{phase: map[string]events.Phase{"s1": events.PhaseReady, "s2": events.PhaseReady}, closed: map[string]bool{},
		ports: map[int]string{8000: echo(t), 8001: greet, 8002: sink}}
	a := &active{sandboxes: sb, reports: make(chan report, 100)}
	clk := &clock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	f := forward.New(a, kvIndex(t), forward.Config{Hold: time.Second, Poll: 10 * time.Millisecond, Sweep: time.Hour, Window: time.Minute, Now: clk.Now}, zerolog.Nop())
	ctx := context.Background()
	bind := func(id, fid string, port int) string {
		t.Helper()
		addr, err := f.Bind(ctx, id, fid, "127.0.0.1:0", port, true)
		if err != nil {
			t.Fatal(err)
		}
		f.Serve(fid)
		return addr
	}
	echoAddr, greetAddr, sinkAddr := bind("s1", "f1", 8000), bind("s1", "f2", 8001), bind("s2", "f3", 8002)
	wait := func(want report) {
		t.Helper()
		select {
		case got := <-a.reports:
			if got.id != want.id || !got.at.Equal(want.at) {
				t.Fatalf("report %+v, want %+v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no report of %+v", want)
		}
	}

	// Many lines, both ways, on one connection and then another.
	c, err := net.Dial("tcp", echoAddr)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for i := range 200 {
		if _, err := io.WriteString(c, strings.Repeat("x", i)+"\n"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	first := clk.Now()
	wait(report{"s1", first})
	if got := say(t, echoAddr, "again"); got != "echo: again" {
		t.Fatalf("through the forward: %q", got)
	}
	clk.add(time.Minute - time.Millisecond) // still within the window
	if got := say(t, greetAddr, ""); got != "hello" {
		t.Fatalf("the greeting: %q", got)
	}

	// Bytes the client only sends, of another sandbox: its own report.
	s, err := net.Dial("tcp", sinkAddr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(s, "into the sink\n"); err != nil {
		t.Fatal(err)
	}
	wait(report{"s2", clk.Now()})
	s.Close()

	// The window since the first report is over: the sandbox's next bytes,
	// a greeting it sends unasked to a client that sends nothing, are
	// reported.
	clk.add(time.Millisecond)
	g, err := net.Dial("tcp", greetAddr)
	if err != nil {
		t.Fatal(err)
	}
	_ = g.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := bufio.NewReader(g).ReadString('\n'); got != "hello\n" {
		t.Fatalf("the greeting: %q, %v", got, err)
	}
	g.Close()
	wait(report{"s1", clk.Now()})
	f.Shut() // waits for every report under way
	close(a.reports)
	for extra := range a.reports {
		t.Errorf("a report more than once per window: %+v", extra)
	}
}
