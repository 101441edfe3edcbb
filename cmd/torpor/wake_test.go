package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/node/servetest"
)

// suspendedWithForward creates a sandbox from r, opens a forward to its
// port, suspends it and returns it and the forward.
func suspendedWithForward(t *testing.T, a *app, c *torpor.Client, r torpor.CreateRequest, port int) (events.View, events.Forward) {
	t.Helper()
	v, err := c.Create(context.Background(), r, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	fw := openForward(t, a, v.ID, port)
	lifecycleTo(t, c, "suspend", v.ID, events.PhaseSuspended)
	return v, fw
}

// resumes are the resume_requested entries of id's history.
func resumes(t *testing.T, c *torpor.Client, id string) []torpor.Event {
	t.Helper()
	h, _ := historyCounts(t, c, id)
	var out []torpor.Event
	for _, e := range h {
		if e.Type == events.TypeResumeRequested {
			out = append(out, e)
		}
	}
	return out
}

// TestWakeOnTrafficProcess: a process sandbox serving HTTP with busybox
// httpd, created with wake_on_traffic and suspended; a client's request
// through its forward wakes it (one resume, its actor the forward) and
// gets its answer; the view says wake_on_traffic.
func TestWakeOnTrafficProcess(t *testing.T) {
	busybox := servetest.Need(t, "busybox")
	a, c, _ := processApp(t, 15*time.Second)
	port := freePort(t)
	v, err := c.Create(context.Background(), torpor.CreateRequest{Driver: "process", WakeOnTraffic: true, Command: []string{"sh", "-c",
		fmt.Sprintf(`echo woken > index.html; exec %s httpd -f -p 127.0.0.1:%d -h .`, busybox, port)}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !v.WakeOnTraffic {
		t.Fatalf("the created view: %+v, want wake_on_traffic", v)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	eventually(t, "httpd listening", func() bool {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	fw := openForward(t, a, v.ID, port)
	lifecycleTo(t, c, "suspend", v.ID, events.PhaseSuspended)

	if got, err := through(t, fw.Address); err != nil || got != "woken\n" {
		t.Fatalf("through the forward of the suspended sandbox: %q, %v", got, err)
	}
	rs := resumes(t, c, v.ID)
	if len(rs) != 1 || rs[0].Actor != "forward:"+fw.ID {
		t.Fatalf("resumes in the history: %+v, want one by forward:%s", rs, fw.ID)
	}
	if got, _ := c.Get(context.Background(), v.ID); got.Phase != events.PhaseReady || got.Generation != 2 {
		t.Fatalf("after the wake: %s generation %d, want ready generation 2", got.Phase, got.Generation)
	}
}

// simServer is an HTTP server of the test that a sim sandbox's port 8000
// maps to (the ports option).
func simServer(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") }))
	t.Cleanup(srv.Close)
	return "8000=" + strings.TrimPrefix(srv.URL, "http://")
}

// TestWakeOnTrafficConcurrent: 20 connections at once to a suspended sim
// sandbox with wake_on_traffic cause exactly one resume, and all get their
// answers. (On one instance the gateway alone records no second resume of
// a sandbox starting already; the key from the generation is what keeps
// it one across instances.)
func TestWakeOnTrafficConcurrent(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	v, fw := suspendedWithForward(t, a, c, torpor.CreateRequest{WakeOnTraffic: true,
		DriverOptions: map[string]string{"ports": simServer(t), "latency": "200ms"}}, 8000)
	var wg sync.WaitGroup
	got := make([]string, 20)
	for i := range got {
		wg.Go(func() {
			body, err := through(t, fw.Address)
			if err != nil {
				body = err.Error()
			}
			got[i] = body
		})
	}
	wg.Wait()
	for i, g := range got {
		if g != "hello" {
			t.Errorf("connection %d: %q, want hello", i, g)
		}
	}
	if rs := resumes(t, c, v.ID); len(rs) != 1 {
		t.Fatalf("resumes in the history: %d (%+v), want 1", len(rs), rs)
	}
}

// TestWakeMaxHeld: serve --wake-max-held 1 holds one connection of a
// waking sandbox; those that come while it is held are refused at once
// with the line that says so, and the held one gets its answer.
func TestWakeMaxHeld(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) { c.WakeMaxHeld = 1 })
	c := appClient(a)
	_, fw := suspendedWithForward(t, a, c, torpor.CreateRequest{WakeOnTraffic: true,
		DriverOptions: map[string]string{"ports": simServer(t), "latency": "1s"}}, 8000)
	var wg sync.WaitGroup
	got := make([]string, 3)
	for i := range got {
		wg.Go(func() {
			// Raw: a refusal is one line of text, not HTTP.
			conn, err := net.DialTimeout("tcp", fw.Address, 5*time.Second)
			if err != nil {
				got[i] = err.Error()
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			_, _ = io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n")
			b, _ := io.ReadAll(conn)
			got[i] = string(b)
		})
	}
	wg.Wait()
	answered, refused := 0, 0
	for _, g := range got {
		switch {
		case strings.HasPrefix(g, "HTTP/1.0 200") && strings.HasSuffix(g, "hello"):
			answered++
		case strings.Contains(g, "1 connections are held for it already"):
			refused++
		default:
			t.Errorf("a connection got %q, want hello or the refusal", g)
		}
	}
	if answered < 1 || refused < 1 {
		t.Errorf("connections: %q; want one answered and the others refused (one held at most)", got)
	}
}

// TestWakeOnTrafficResumeFails: the resume a connection asks for fails
// (the sim's resume: fail): the client's connection is refused with the
// line why, the history has the failed resume, and the sandbox stays
// suspended, so a later connection asks again.
func TestWakeOnTrafficResumeFails(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	v, fw := suspendedWithForward(t, a, c, torpor.CreateRequest{WakeOnTraffic: true,
		DriverOptions: map[string]string{"ports": simServer(t), "resume": "fail"}}, 8000)
	refusal := func() string {
		t.Helper()
		conn, err := net.DialTimeout("tcp", fw.Address, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		_, _ = io.WriteString(conn, "GET / HTTP/1.0\r\n\r\n")
		// The request is never read: closing the connection may reset it
		// after the line.
		b, _ := io.ReadAll(conn)
		return string(b)
	}
	if got := refusal(); !strings.HasPrefix(got, "torpor: sandbox "+v.ID+" did not wake: its resume failed") {
		t.Fatalf("the client read %q, want the refusal", got)
	}
	_, count := historyCounts(t, c, v.ID)
	if count[events.TypeResumeRequested] != 1 || count[events.TypeResumeFailed] != 1 {
		t.Fatalf("the history: %v, want one resume requested and failed", count)
	}
	if got, _ := c.Get(context.Background(), v.ID); got.Phase != events.PhaseSuspended {
		t.Fatalf("after the failed wake: %s, want suspended", got.Phase)
	}
	if got := refusal(); !strings.Contains(got, "did not wake") {
		t.Fatalf("the client read %q, want the refusal", got)
	}
	if _, count = historyCounts(t, c, v.ID); count[events.TypeResumeRequested] != 2 {
		t.Fatalf("the history: %v, want a second resume asked for by the second connection", count)
	}
}

// TestNoWakeWithoutOptIn: a suspended sandbox created without
// wake_on_traffic is not resumed by a connection: the connection is held
// and then refused, and no resume is recorded.
func TestNoWakeWithoutOptIn(t *testing.T) {
	a := startApp(t, "", nil)
	c := appClient(a)
	v, fw := suspendedWithForward(t, a, c, torpor.CreateRequest{DriverOptions: map[string]string{"ports": simServer(t)}}, 8000)
	if v.WakeOnTraffic {
		t.Fatalf("the view: %+v, want no wake_on_traffic", v)
	}
	got, err := through(t, fw.Address)
	if err == nil {
		t.Fatalf("through the forward of the suspended sandbox: %q, want it refused", got)
	}
	if rs := resumes(t, c, v.ID); len(rs) != 0 {
		t.Fatalf("resumes in the history: %+v, want none", rs)
	}
	if got, _ := c.Get(context.Background(), v.ID); got.Phase != events.PhaseSuspended {
		t.Fatalf("after the connection: %s, want suspended", got.Phase)
	}
}
