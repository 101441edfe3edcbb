package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// openForward opens a forward to port of sandbox id and returns it.
func openForward(t *testing.T, a *app, id string, port int) events.Forward {
	t.Helper()
	resp, err := http.Post("http://"+a.HTTPAddr()+"/v1/sandboxes/"+id+"/forwards", "application/json",
		strings.NewReader(fmt.Sprintf(`{"listen":"127.0.0.1:0","port":%d}`, port)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("open forward: %d %s", resp.StatusCode, body)
	}
	return decodeJSON[events.Forward](t, resp.Body)
}

// through sends a GET through a forward at addr and returns the body.
func through(t *testing.T, addr string) (string, error) {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// throughLater sends a GET through the forward at addr meanwhile; the
// channel gets the body, or the error's text.
func throughLater(t *testing.T, addr string) <-chan string {
	held := make(chan string, 1)
	go func() {
		got, err := through(t, addr)
		if err != nil {
			got = err.Error()
		}
		held <- got
	}()
	return held
}

// TestForwardsThroughSuspensions: a forward to a sandbox's port (the sim's
// ports option maps it to a real server of the test) carries HTTP; a
// suspension the driver rejects leaves it carrying; while the sandbox is
// suspended a request is held, and carried once it is resumed; the forward
// is in the view, comes back where it was after a restart, and is gone once
// closed.
func TestForwardsThroughSuspensions(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") }))
	t.Cleanup(srv.Close)
	port := "8000=" + strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	a := startApp(t, dir, nil)
	c := appClient(a)
	ctx := context.Background()

	stubborn, _ := c.Create(ctx, torpor.CreateRequest{Name: "stubborn", DriverOptions: map[string]string{"ports": port, "suspend": "reject"}}, "")
	mustWait(t, c, stubborn.ID, events.PhaseReady)
	fw := openForward(t, a, stubborn.ID, 8000)
	if got, err := through(t, fw.Address); err != nil || got != "hello" {
		t.Fatalf("through the forward: %q, %v", got, err)
	}
	acc, err := c.Lifecycle(ctx, "suspend", stubborn.ID, false, "")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.WaitAfter(ctx, stubborn.ID, events.PhaseReady, acc.Seq, waitFor); err != nil || v.LastOutcome != events.OutcomeSuspendRejected {
		t.Fatalf("the rejected suspension: %+v, %v", v, err)
	}
	if got, err := through(t, fw.Address); err != nil || got != "hello" {
		t.Fatalf("through the forward after the rejected suspension: %q, %v", got, err)
	}

	sb, _ := c.Create(ctx, torpor.CreateRequest{Name: "sleeper", DriverOptions: map[string]string{"ports": port}}, "")
	mustWait(t, c, sb.ID, events.PhaseReady)
	fw2 := openForward(t, a, sb.ID, 8000)
	// The view shows the forward once it has caught up with its event.
	var inView []events.Forward
	eventually(t, "the forward in the view", func() bool {
		v, _ := c.Get(ctx, sb.ID)
		inView = v.Forwards
		return len(v.Forwards) > 0
	})
	if len(inView) != 1 || inView[0] != fw2 {
		t.Fatalf("the view's forwards %+v, want %+v", inView, fw2)
	}
	acc, err = c.Lifecycle(ctx, "suspend", sb.ID, false, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitAfter(ctx, sb.ID, events.PhaseSuspended, acc.Seq, waitFor); err != nil {
		t.Fatal(err)
	}
	held := throughLater(t, fw2.Address)
	select {
	case got := <-held:
		t.Fatalf("a request to the suspended sandbox was answered: %q", got)
	case <-time.After(300 * time.Millisecond): // it waits meanwhile
	}
	if _, err := c.Lifecycle(ctx, "resume", sb.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	if got := <-held; got != "hello" {
		t.Fatalf("a request held across the resume: %q", got)
	}

	// After a restart the forward is where it was.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	b := startApp(t, dir, nil)
	c = appClient(b)
	deadline := time.Now().Add(waitFor)
	for {
		got, err := through(t, fw2.Address)
		if err == nil && got == "hello" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forward after the restart: %q, %v", got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+b.HTTPAddr()+"/v1/sandboxes/"+sb.ID+"/forwards/"+fw2.ID, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("close the forward: %v %v", resp, err)
	}
	closed := decodeJSON[events.View](t, resp.Body)
	resp.Body.Close()
	if _, err := through(t, fw2.Address); err == nil {
		t.Fatal("a closed forward still carries")
	}
	// The view shows the close once it has caught up with its event.
	if v, err := c.WaitAfter(ctx, sb.ID, events.PhaseReady, closed.Seq-1, waitFor); err != nil || len(v.Forwards) != 0 {
		t.Fatalf("the view's forwards after the close: %+v, %v", v.Forwards, err)
	}
}

// decodeJSON decodes r into a fresh T.
func decodeJSON[T any](t *testing.T, r io.Reader) T {
	t.Helper()
	var v T
	if err := json.NewDecoder(r).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
