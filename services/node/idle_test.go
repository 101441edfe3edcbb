package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	torpor "github.com/torpor/torpor/sdk/go"
)

// idleWindow is the activity window of these tests' nodes: idle policies
// must be longer.
const idleWindow = 200 * time.Millisecond

// idleHistory is sb's history: its types in order, its idle timeouts and
// their envelopes' times and actors, and the actor of what follows each.
type idleHistory struct {
	types    []string
	timeouts []events.IdleTimeout
	at       []time.Time
	actors   []string // of each timeout, then of the event after it
}

func historyIdle(t *testing.T, c *torpor.Client, id string) idleHistory {
	t.Helper()
	h, err := c.History(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out idleHistory
	for i, e := range h {
		out.types = append(out.types, e.Type)
		if e.Type != events.TypeIdleTimeout {
			continue
		}
		var x events.IdleTimeout
		if err := json.Unmarshal(e.Data, &x); err != nil {
			t.Fatal(err)
		}
		out.timeouts, out.at = append(out.timeouts, x), append(out.at, e.Time)
		out.actors = append(out.actors, e.Actor)
		if i+1 < len(h) {
			out.actors = append(out.actors, h[i+1].Actor)
		}
	}
	return out
}

// checkNodeLog runs the checker over n's log.
func checkNodeLog(t *testing.T, n *Node) {
	t.Helper()
	vs, err := check.Replay(context.Background(), n.Store(), check.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Errorf("the log breaks an invariant: %v", v)
	}
}

// TestIdleEndToEnd (issue 27, item 2): through the HTTP API of a node on
// the sim driver, on real time: a sandbox with no activity is suspended
// after its idle policy's after, through an idle timeout with the
// evidence and appended with the suspend's intent by sagas:idle, which
// leave last_active_at as it was; one touched meanwhile is not, until
// after its last touch; a driver that cannot suspend stops it with
// fallback stop and leaves it running with fallback none (nothing
// recorded); a rejected suspension leaves it running, the history says
// so, and it is not tried again until new activity. The metrics count the
// timeouts by action; the log passes the checker.
func TestIdleEndToEnd(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.ActivityWindow = idleWindow
	n := startNode(t, cfg)
	ctx := context.Background()
	c := torpor.New(n.HTTPURL(), nil).WithToken(n.AdminToken())
	const idleAfter = 800 * time.Millisecond
	create := func(t *testing.T, p events.IdlePolicy, opts map[string]string) events.View {
		t.Helper()
		v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim", DriverOptions: opts, Idle: &p}, "")
		if err != nil {
			t.Fatal(err)
		}
		if v, err = c.Wait(ctx, v.ID, events.PhaseReady, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		return v
	}

	t.Run("idle: suspended", func(t *testing.T) {
		v := create(t, events.IdlePolicy{After: idleAfter.String()}, nil)
		s, err := c.Wait(ctx, v.ID, events.PhaseSuspended, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		h := historyIdle(t, c, v.ID)
		want := events.IdlePolicy{After: idleAfter.String(), Action: "suspend", Fallback: "none"}
		if len(h.timeouts) != 1 || h.timeouts[0].Policy != want || h.timeouts[0].Action != "suspend" || !h.timeouts[0].LastActiveAt.Equal(v.LastActiveAt) {
			t.Fatalf("idle timeouts %+v; want one, policy %+v, action suspend, evidence %s", h.timeouts, want, v.LastActiveAt)
		}
		if since := events.IdleSince(v.LastActiveAt, v.PhaseSince); h.at[0].Before(since.Add(idleAfter)) {
			t.Fatalf("idle timeout at %s, before %s + %s", h.at[0], since, idleAfter)
		}
		if got := after(h.types, events.TypeIdleTimeout); got != events.TypeSuspendRequested || h.actors[0] != events.IdleActor || h.actors[1] != events.IdleActor {
			t.Fatalf("history %v, actors %v: want suspend_requested after the idle timeout, both by %s", h.types, h.actors, events.IdleActor)
		}
		if !s.LastActiveAt.Equal(v.LastActiveAt) {
			t.Fatalf("last_active_at %s after the idle suspension, want %s: the idle timeout is no activity", s.LastActiveAt, v.LastActiveAt)
		}
	})
	t.Run("touched: not until after its last touch", func(t *testing.T) {
		v := create(t, events.IdlePolicy{After: idleAfter.String()}, nil)
		var last time.Time
		for end := time.Now().Add(3 * idleAfter); time.Now().Before(end); {
			tv, err := c.Touch(ctx, v.ID, "")
			if err != nil {
				t.Fatalf("touch: %v (the sandbox %s)", err, tv.Phase)
			}
			last = tv.LastActiveAt
			time.Sleep(idleWindow + 50*time.Millisecond) // activity, spread over the window: no synchronisation
		}
		if got, err := c.Get(ctx, v.ID); err != nil || got.Phase != events.PhaseReady {
			t.Fatalf("touched every %s for %s: %s, %v; want ready", idleWindow, 3*idleAfter, got.Phase, err)
		}
		if _, err := c.Wait(ctx, v.ID, events.PhaseSuspended, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		h := historyIdle(t, c, v.ID)
		if len(h.timeouts) != 1 || !h.timeouts[0].LastActiveAt.Equal(last) || h.at[0].Before(last.Add(idleAfter)) {
			t.Fatalf("idle timeouts %+v at %v; want one on the last touch %s, %s after it", h.timeouts, h.at, last, idleAfter)
		}
	})
	t.Run("no suspend, fallback stop: stopped", func(t *testing.T) {
		v := create(t, events.IdlePolicy{After: idleAfter.String(), Fallback: "stop"}, map[string]string{"suspend": "unimplemented"})
		if _, err := c.Wait(ctx, v.ID, events.PhaseStopped, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		h := historyIdle(t, c, v.ID)
		if len(h.timeouts) != 1 || h.timeouts[0].Action != "stop" || after(h.types, events.TypeIdleTimeout) != events.TypeStopRequested {
			t.Fatalf("history %v, idle timeouts %+v; want one, action stop, then stop_requested", h.types, h.timeouts)
		}
	})
	t.Run("suspension rejected: running, and the history says so", func(t *testing.T) {
		v := create(t, events.IdlePolicy{After: idleAfter.String()}, map[string]string{"suspend": "reject"})
		var h idleHistory
		deadline := time.Now().Add(10 * time.Second)
		for {
			h = historyIdle(t, c, v.ID)
			if len(h.types) > 0 && h.types[len(h.types)-1] == events.TypeSuspendRejected {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("history %v: no suspend_rejected", h.types)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(h.timeouts) != 1 || after(h.types, events.TypeIdleTimeout) != events.TypeSuspendRequested {
			t.Fatalf("history %v: want one idle timeout, then suspend_requested", h.types)
		}
		got, err := c.Get(ctx, v.ID)
		if err != nil || got.Phase != events.PhaseReady || got.LastOutcome != events.OutcomeSuspendRejected {
			t.Fatalf("after the rejection: %s, last outcome %q, %v; want ready, %s", got.Phase, got.LastOutcome, err, events.OutcomeSuspendRejected)
		}
		time.Sleep(2 * idleAfter) // no new activity: the timeout is spent, not tried again
		if h := historyIdle(t, c, v.ID); len(h.timeouts) != 1 {
			t.Fatalf("history %v: %d idle timeouts, want one since the last activity", h.types, len(h.timeouts))
		}
	})
	t.Run("no suspend, fallback none: left running, nothing recorded", func(t *testing.T) {
		v := create(t, events.IdlePolicy{After: idleAfter.String()}, map[string]string{"suspend": "unimplemented"})
		time.Sleep(3 * idleAfter) // nothing is to happen: there is no event to wait on
		got, err := c.Get(ctx, v.ID)
		if err != nil || got.Phase != events.PhaseReady {
			t.Fatalf("%s after %s idle, %v; want ready", got.Phase, 3*idleAfter, err)
		}
		if h := historyIdle(t, c, v.ID); len(h.timeouts) != 0 {
			t.Fatalf("history %v: want no idle timeout", h.types)
		}
	})

	req, _ := http.NewRequest(http.MethodGet, n.HTTPURL()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+n.AdminToken())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`torpor_idle_timeouts_total{action="suspend"} 3`, `torpor_idle_timeouts_total{action="stop"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	checkNodeLog(t, n)
}

