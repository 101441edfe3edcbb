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

// waitHistory polls sandbox id's history until done says so of its types
// (there is no event to wait on in the view: a rejected suspension leaves
// it ready) and returns it.
func waitHistory(t *testing.T, c *torpor.Client, id string, done func([]string) bool) idleHistory {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; {
		h := historyIdle(t, c, id)
		if len(h.types) > 0 && done(h.types) {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("history %v: not what was waited for", h.types)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
		h := waitHistory(t, c, v.ID, func(types []string) bool { return types[len(types)-1] == events.TypeSuspendRejected })
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

// joined starts two processes serving node n1 on hub's NATS (the sagas'
// lease held by one of them), with the activity window of these tests.
func joined(t *testing.T, hub *Node) (a, b *Node) {
	t.Helper()
	file := serviceCreds(t, hub)
	join := func() *Node {
		cfg := testConfig(t, "n1")
		cfg.NATSURL, cfg.NATSCreds, cfg.NATSListen = hub.NATSURL(), file, ""
		cfg.LeaseTTL = 3 * time.Second
		cfg.ActivityWindow = idleWindow
		return startNode(t, cfg)
	}
	return join(), join()
}

// TestIdleAfterTakeover: the process holding node n1's sagas stops before
// a sandbox's idle policy comes due; the other process serving n1 takes
// the sagas over and fires it, once (its key in torpor_timers, or the
// saved position holding the event that armed it).
func TestIdleAfterTakeover(t *testing.T) {
	hub := startNode(t, testConfig(t, "n0"))
	a, b := joined(t, hub)
	ctx := context.Background()
	c := torpor.New(a.HTTPURL(), nil).WithToken(hub.AdminToken())
	v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim", Idle: &events.IdlePolicy{After: "4s"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if v, err = c.Wait(ctx, v.ID, events.PhaseReady, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	holder, other := a, b
	if b.Sim().Calls()["start"] > 0 {
		holder, other = b, a
	}
	if err := holder.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if due := events.IdleSince(v.LastActiveAt, v.PhaseSince).Add(4 * time.Second); time.Now().After(due) {
		t.Fatalf("the holder stopped after the idle timeout was due (%s): nothing tested", due)
	}
	// The suspend saga runs on the other process, whose sim driver never
	// started the sandbox: it rejects the suspension. What is tested is
	// that the idle timeout fires, once.
	oc := torpor.New(other.HTTPURL(), nil).WithToken(hub.AdminToken())
	h := waitHistory(t, oc, v.ID, func(types []string) bool {
		last := types[len(types)-1]
		return last == events.TypeSuspended || last == events.TypeSuspendRejected
	})
	if len(h.timeouts) != 1 || after(h.types, events.TypeIdleTimeout) != events.TypeSuspendRequested {
		t.Fatalf("history %v: want one idle timeout, then suspend_requested", h.types)
	}
	time.Sleep(time.Second) // a second timeout would come within the lease's renewal: none is to
	if h := historyIdle(t, oc, v.ID); len(h.timeouts) != 1 {
		t.Fatalf("history %v: %d idle timeouts, want one", h.types, len(h.timeouts))
	}
	checkNodeLog(t, hub)
}

// TestIdleAcrossInstances: two processes serve node n1; one holds the
// sagas, which decide idleness, while a client touches the sandbox through
// the other only. The activity recorded there keeps the sandbox ready well
// past its idle policy's after: the decider never suspends it; once the
// touches stop, it does, on the last touch as its evidence.
func TestIdleAcrossInstances(t *testing.T) {
	hub := startNode(t, testConfig(t, "n0"))
	a, b := joined(t, hub)
	ctx := context.Background()
	const idleAfter = 800 * time.Millisecond
	ca := torpor.New(a.HTTPURL(), nil).WithToken(hub.AdminToken())
	cb := torpor.New(b.HTTPURL(), nil).WithToken(hub.AdminToken())
	v, err := ca.Create(ctx, torpor.CreateRequest{Driver: "sim", Idle: &events.IdlePolicy{After: idleAfter.String()}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err = ca.Wait(ctx, v.ID, events.PhaseReady, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Touch through the process that does not hold the sagas.
	toucher := cb
	if b.Sim().Calls()["start"] > 0 {
		toucher = ca
	}
	var last time.Time
	for end := time.Now().Add(4 * idleAfter); time.Now().Before(end); {
		tv, err := toucher.Touch(ctx, v.ID, "")
		if err != nil {
			t.Fatalf("touch: %v", err)
		}
		last = tv.LastActiveAt
		time.Sleep(idleWindow + 50*time.Millisecond) // activity, spread over the window: no synchronisation
	}
	if got, err := ca.Get(ctx, v.ID); err != nil || got.Phase != events.PhaseReady {
		t.Fatalf("touched through the other instance for %s: %s, %v; want ready", 4*idleAfter, got.Phase, err)
	}
	if _, err := ca.Wait(ctx, v.ID, events.PhaseSuspended, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	h := historyIdle(t, ca, v.ID)
	if len(h.timeouts) != 1 || !h.timeouts[0].LastActiveAt.Equal(last) {
		t.Fatalf("idle timeouts %+v; want one on the last touch, %s", h.timeouts, last)
	}
	checkNodeLog(t, hub)
}
