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

// TestActivityThroughForward: bytes through a sandbox's forward (the sim's
// ports option maps its port to a server of the test), over many requests
// and connections, are one sandbox.active of source forward within the
// activity window; a touch within it appends nothing more. The history
// shows the event with its source; last_active_at is its time in the KV
// view and in the SQL view alike. The checker passes over the log
// (startApp's cleanup).
func TestActivityThroughForward(t *testing.T) {
	db, schema := sqlSchema(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strings.Repeat("x", 64<<10)) // many packets
	}))
	t.Cleanup(srv.Close)
	a := startApp(t, "", func(c *serveConfig) { c.ProjectionDB, c.ActivityWindow = db, time.Hour })
	c := appClient(a)
	ctx := context.Background()
	v, err := c.Create(ctx, torpor.CreateRequest{Name: "busy", DriverOptions: map[string]string{"ports": "8000=" + strings.TrimPrefix(srv.URL, "http://")}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	fw := openForward(t, a, v.ID, 8000)
	actives := func() []events.HistoryEntry {
		t.Helper()
		h, err := c.History(ctx, v.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []events.HistoryEntry
		for _, e := range h {
			if e.Type == events.TypeActive {
				out = append(out, e)
			}
		}
		return out
	}
	for range 20 {
		if got, err := through(t, fw.Address); err != nil || len(got) != 64<<10 {
			t.Fatalf("through the forward: %d bytes, %v", len(got), err)
		}
	}
	eventually(t, "the forward's activity in the history", func() bool { return len(actives()) > 0 })
	for range 20 {
		if _, err := through(t, fw.Address); err != nil {
			t.Fatal(err)
		}
	}
	touched, err := c.Touch(ctx, v.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	viewsCaughtUp(t, a)
	as := actives()
	if len(as) != 1 {
		t.Fatalf("%d sandbox.active in the history, want 1 within the window: %+v", len(as), as)
	}
	var e events.Active
	if err := json.Unmarshal(as[0].Data, &e); err != nil || e.Source != events.ActiveForward || as[0].Actor != "forward" || e.At.IsZero() {
		t.Fatalf("sandbox.active %s by %s (%v); want source forward, actor forward, at set", as[0].Data, as[0].Actor, err)
	}
	if !touched.LastActiveAt.Equal(e.At) {
		t.Fatalf("the touch answered last_active_at %s, want the forward's %s", touched.LastActiveAt, e.At)
	}
	kv, err := c.Get(ctx, v.ID)
	if err != nil || !kv.LastActiveAt.Equal(e.At) {
		t.Fatalf("KV view %+v, %v: last_active_at want %s", kv, err, e.At)
	}
	// The SQL view's column, to the nanosecond, as the KV view has it.
	got := psql(t, testDatabase(t), fmt.Sprintf(`SELECT (extract(epoch FROM last_active_at) * 1000000)::INT8 * 1000 + last_active_at_nanos FROM %s.torpor_sandboxes WHERE id = '%s'`, schema, v.ID))
	if want := fmt.Sprint(kv.LastActiveAt.UnixNano()); got != want {
		t.Fatalf("SQL view's last_active_at %s ns, want the KV view's %s", got, want)
	}
}

// TestBusyProcessSandboxIsActive: a process sandbox whose workload spins
// on a CPU, with no API call and no forward traffic, is active: its
// supervisor's heartbeats say so and the history has a sandbox.active of
// source supervisor, one per window; one that sleeps has none over as many
// beats.
func TestBusyProcessSandboxIsActive(t *testing.T) {
	// Beats every 200ms; a short window, so that the busy one records
	// activity again and again while the other beats on.
	_, c, _ := processApp(t, 600*time.Millisecond, func(c *serveConfig) { c.ActivityWindow = 300 * time.Millisecond })
	ctx := context.Background()
	busy, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sh", "-c", "while :; do :; done"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	idle, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sleep", "3600"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, busy.ID, events.PhaseReady)
	ready := mustWait(t, c, idle.ID, events.PhaseReady)
	activeOf := func(id string) []events.HistoryEntry {
		h, err := c.History(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []events.HistoryEntry
		for _, e := range h {
			if e.Type == events.TypeActive {
				out = append(out, e)
			}
		}
		return out
	}
	var got []events.HistoryEntry
	eventually(t, "the busy sandbox's activity in three windows", func() bool { got = activeOf(busy.ID); return len(got) >= 3 })
	var e events.Active
	if err := json.Unmarshal(got[0].Data, &e); err != nil || e.Source != events.ActiveSupervisor || !strings.HasPrefix(got[0].Actor, "supervisor:") {
		t.Fatalf("sandbox.active %s by %s (%v); want source supervisor, by its supervisor", got[0].Data, got[0].Actor, err)
	}
	// The sleeping one beat as often meanwhile, ready all along.
	if a := activeOf(idle.ID); len(a) != 0 {
		t.Fatalf("the sleeping sandbox: %+v, want no sandbox.active", a)
	}
	if v, err := c.Get(ctx, idle.ID); err != nil || v.Phase != events.PhaseReady || !v.LastActiveAt.Equal(ready.LastActiveAt) {
		t.Fatalf("the sleeping sandbox's view %+v, %v; want ready, last active at its create", v, err)
	}
}
