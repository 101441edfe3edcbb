package main

import (
	"context"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// TestBusyProcessSandboxIsNotIdled (issue 27): under the server's default
// idle policy (serve --idle-after), a process sandbox whose workload spins
// on a CPU, with no API call and no forward traffic, is not idled within a
// window where one that sleeps is suspended: its supervisor's busy
// heartbeats are activity. The checker passes over the log (startApp's
// cleanup).
func TestBusyProcessSandboxIsNotIdled(t *testing.T) {
	const idleAfter = 2 * time.Second
	// Beats every 200ms, activity recorded at most every 300ms.
	_, c, _ := processApp(t, 600*time.Millisecond, func(c *serveConfig) {
		c.ActivityWindow, c.IdleAfter = 300*time.Millisecond, idleAfter
	})
	ctx := context.Background()
	busy, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sh", "-c", "while :; do :; done"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	sleeping, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sleep", "600"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if busy.Idle.Duration() != idleAfter || busy.Idle.Action != events.IdleSuspend {
		t.Fatalf("idle policy %+v, want the server's default: %s, suspend", busy.Idle, idleAfter)
	}
	ready := mustWait(t, c, busy.ID, events.PhaseReady)
	mustWait(t, c, sleeping.ID, events.PhaseReady)
	mustWait(t, c, sleeping.ID, events.PhaseSuspended)
	// Past twice the policy's after since the busy one was ready: it would
	// have been idled by now, had its workload been no activity.
	if wait := time.Until(ready.PhaseSince.Add(2 * idleAfter)); wait > 0 {
		time.Sleep(wait) // nothing is to happen: there is no event to wait on
	}
	v, err := c.Get(ctx, busy.ID)
	if err != nil || v.Phase != events.PhaseReady {
		t.Fatalf("the busy sandbox %s, %v; want ready", v.Phase, err)
	}
	if !v.LastActiveAt.After(ready.PhaseSince) {
		t.Fatalf("the busy sandbox last active at %s, want after it was ready (%s)", v.LastActiveAt, ready.PhaseSince)
	}
	h, err := c.History(ctx, busy.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range h {
		if e.Type == events.TypeIdleTimeout {
			t.Fatalf("the busy sandbox's history has an idle timeout: %s", e.Data)
		}
	}
	hs, err := c.History(ctx, sleeping.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range hs {
		if e.Type == events.TypeIdleTimeout {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the sleeping sandbox's history has %d idle timeouts, want 1", n)
	}
}
