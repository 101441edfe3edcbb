package torpor_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// unique is a fresh name or label value.
func unique() string { return uuid.Must(uuid.NewV7()).String() }

// lifecycleClient is what the verb walk needs of a client: both have it.
type lifecycleClient interface {
	torpor.Sandboxes
	waitFor(ctx context.Context, id string, phase events.Phase) (events.View, error)
	History(ctx context.Context, id string, after uint64) ([]torpor.Event, error)
	List(ctx context.Context, phase, label string, limit int, cursor string) (torpor.Page, error)
	Phases(ctx context.Context) (map[events.Phase]int, error)
}

type httpClient struct{ *torpor.Client }

func (c httpClient) waitFor(ctx context.Context, id string, phase events.Phase) (events.View, error) {
	return c.Wait(ctx, id, phase, waitFor)
}

type busClient struct{ *torpor.Bus }

func (c busClient) waitFor(ctx context.Context, id string, phase events.Phase) (events.View, error) {
	return c.Wait(ctx, id, phase)
}

// walk drives one sandbox through every verb with c and checks each
// answer, the history and the reads.
func walk(t *testing.T, ctx context.Context, c lifecycleClient) {
	t.Helper()
	label := unique()
	name := "walk-" + label[len(label)-12:]
	req := sim()
	req.Name, req.Labels = name, map[string]string{"walk": label}
	v, err := c.Create(ctx, req, "")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if v.ID == "" || v.Name != name || v.Driver != "sim" {
		t.Fatalf("create answered %+v", v)
	}
	id := v.ID
	wait := func(phase events.Phase) events.View {
		t.Helper()
		got, err := c.waitFor(ctx, id, phase)
		if err != nil || got.Phase != phase || got.ID != id {
			t.Fatalf("wait for %s: %+v, %v", phase, got, err)
		}
		return got
	}
	ready := wait(events.PhaseReady)
	if got, err := c.Get(ctx, id); err != nil || got.ID != id || got.Seq < ready.Seq {
		t.Fatalf("get: %+v, %v", got, err)
	}
	for _, step := range []struct {
		verb string
		do   func() (events.View, error)
		then events.Phase
	}{
		{"stop", func() (events.View, error) { return c.Stop(ctx, id) }, events.PhaseStopped},
		{"start", func() (events.View, error) { return c.Start(ctx, id) }, events.PhaseReady},
		{"suspend", func() (events.View, error) { return c.Suspend(ctx, id) }, events.PhaseSuspended},
		{"resume", func() (events.View, error) { return c.Resume(ctx, id, torpor.ResumeOptions{}, "") }, events.PhaseReady},
		{"delete", func() (events.View, error) { return c.Delete(ctx, id, "") }, events.PhaseDeleted},
	} {
		got, err := step.do()
		if err != nil || got.ID != id {
			t.Fatalf("%s: %+v, %v", step.verb, got, err)
		}
		wait(step.then)
	}
	hist, err := c.History(ctx, id, 0)
	if err != nil {
		t.Fatalf("history: %v", err)
	}
	count := map[string]int{}
	var last uint64
	for _, e := range hist {
		count[e.Type]++
		if e.Seq <= last {
			t.Errorf("history: seq %d after %d", e.Seq, last)
		}
		last = e.Seq
	}
	for _, typ := range []string{"sandbox.created", "sandbox.stop_requested", "sandbox.start_requested", "sandbox.suspend_requested", "sandbox.resume_requested", "sandbox.delete_requested", "sandbox.deleted"} {
		if count[typ] != 1 {
			t.Errorf("history: %d events %s; want 1 (%v)", count[typ], typ, count)
		}
	}
	if tail, err := c.History(ctx, id, last); err != nil || len(tail) != 0 {
		t.Errorf("history after the last seq: %v, %v; want none", tail, err)
	}
	page, err := c.List(ctx, "", "walk="+label, 0, "")
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != id || page.Items[0].Phase != events.PhaseDeleted {
		t.Errorf("list by label: %+v, %v; want the one sandbox, deleted", page, err)
	}
	counts, err := c.Phases(ctx)
	if err != nil || counts[events.PhaseDeleted] < 1 {
		t.Errorf("phases: %v, %v; want at least one deleted", counts, err)
	}
	for _, p := range events.Phases {
		if _, ok := counts[p]; !ok {
			t.Errorf("phases: no count of %s", p)
		}
	}
}

// TestHTTPListWith: ListWith passes the filters and the sort to the
// server, pages a sorted list with its cursors, and the page says the
// total of matches; an unknown sort is INVALID_ARGUMENT.
func TestHTTPListWith(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	label := unique()
	sfx := label[len(label)-8:]
	ids := map[string]string{}
	for _, n := range []string{"b", "c", "a"} {
		r := sim()
		r.Name, r.Labels = "lw-"+sfx+"-"+n, map[string]string{"lw": label}
		v, err := c.Create(ctx, r, "")
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = v.ID
	}
	// A list reads the KV view, which lags the log (CONTRACT §6): each
	// sandbox is waited for in it first (listed before, one was missing
	// now and then).
	for _, id := range ids {
		if _, err := c.Wait(ctx, id, torpor.PhaseReady, 0); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	opts := torpor.ListOptions{Label: "lw=" + label, Sort: "-name", Limit: 2}
	for range 3 {
		page, err := c.ListWith(ctx, opts)
		if err != nil {
			t.Fatalf("ListWith(%+v): %v", opts, err)
		}
		if page.Total != 3 {
			t.Errorf("ListWith(%+v): total %d, want 3", opts, page.Total)
		}
		for _, v := range page.Items {
			got = append(got, v.ID)
		}
		if opts.Cursor = page.Next; opts.Cursor == "" {
			break
		}
	}
	if want := []string{ids["c"], ids["b"], ids["a"]}; !slices.Equal(got, want) {
		t.Errorf("sorted by -name: %v, want %v", got, want)
	}
	page, err := c.ListWith(ctx, torpor.ListOptions{Name: strings.ToUpper(sfx) + "-A", Driver: "sim", Node: serveNode})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != ids["a"] || page.Total != 1 {
		t.Errorf("ListWith(name in upper case, driver, node): %+v, %v; want lw-%s-a alone", page, err, sfx)
	}
	if page, err := c.ListWith(ctx, torpor.ListOptions{Label: "lw=" + label, Driver: "process"}); err != nil || len(page.Items) != 0 || page.Total != 0 {
		t.Errorf("ListWith(another driver): %+v, %v; want none", page, err)
	}
	if _, err := c.ListWith(ctx, torpor.ListOptions{Sort: "size"}); !errors.Is(err, torpor.ErrInvalidArgument) {
		t.Errorf("ListWith(sort size): %v, want INVALID_ARGUMENT", err)
	}
}

// Every verb and read over HTTP.
func TestHTTPVerbs(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	walk(t, ctx, httpClient{c})

	drivers, err := c.Drivers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range drivers {
		if d.Name == "sim" {
			found = d.Capabilities.Suspend
		}
	}
	if !found {
		t.Errorf("drivers: %+v; want sim, able to suspend", drivers)
	}
	// What the server says of itself: what it was started with.
	info, err := c.Server(ctx)
	if err != nil || info.Node != "sdk-node" || info.Deadline() != 45*time.Second || info.ReadFrom != "kv" {
		t.Errorf("server: %+v (deadline %s), %v; want node sdk-node, deadline 45s, reads from kv", info, info.Deadline(), err)
	}
	// By name, and at a past seq.
	req := sim()
	req.Name = "named-" + unique()[24:]
	v := mustCreate(t, ctx, c, req)
	ready := mustWait(t, ctx, c, v.ID, events.PhaseReady)
	if got, err := c.Get(ctx, req.Name); err != nil || got.ID != v.ID {
		t.Errorf("get by name: %+v, %v", got, err)
	}
	if got, err := c.GetAt(ctx, v.ID, "1"); err == nil && got.Phase == events.PhaseReady {
		t.Errorf("get at seq 1: %+v; want the sandbox before it was ready", got)
	}
	if got, err := c.GetAt(ctx, v.ID, time.Now().UTC().Format(time.RFC3339Nano)); err != nil || got.Seq != ready.Seq {
		t.Errorf("get at now: %+v, %v; want seq %d", got, err, ready.Seq)
	}
	if _, err := c.Logs(ctx, v.ID, 10); err != nil {
		t.Errorf("logs: %v", err)
	}
	// A touch records activity once per window: the view answers when.
	touched, err := c.Touch(ctx, v.ID, "")
	if err != nil || touched.ID != v.ID || touched.LastActiveAt.IsZero() || touched.Seq <= ready.Seq {
		t.Errorf("touch: %+v, %v; want the view after a sandbox.active, last_active_at set", touched, err)
	}
	if again, err := c.Touch(ctx, v.ID, ""); err != nil || again.Seq != touched.Seq || !again.LastActiveAt.Equal(touched.LastActiveAt) {
		t.Errorf("touch again within the window: %+v, %v; want the same view (seq %d)", again, err, touched.Seq)
	}
	if _, err := c.Touch(ctx, unique(), ""); !errors.Is(err, torpor.ErrNotFound) {
		t.Errorf("touch of an unknown sandbox: %v; want NOT_FOUND", err)
	}
}

// checkErrors checks the codes both clients answer with.
func checkErrors(t *testing.T, ctx context.Context, c lifecycleClient) {
	t.Helper()
	v, err := c.Create(ctx, sim(), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.waitFor(ctx, v.ID, events.PhaseReady); err != nil {
		t.Fatal(err)
	}
	// Resume needs suspended: a wrong phase.
	_, err = c.Resume(ctx, v.ID, torpor.ResumeOptions{}, "")
	if !errors.Is(err, torpor.ErrFailedPrecondition) {
		t.Errorf("resume of a ready sandbox: %v; want FAILED_PRECONDITION", err)
	}
	if errors.Is(err, torpor.ErrNotFound) {
		t.Errorf("resume of a ready sandbox: %v matches NOT_FOUND too", err)
	}
	var e *torpor.Error
	if !errors.As(err, &e) || e.Code != events.CodeFailedPrecondition || e.Message == "" || torpor.CodeOf(err) != events.CodeFailedPrecondition {
		t.Errorf("errors.As(%v): %+v; want the code and the server's message", err, e)
	}
	unknown := unique()
	if _, err := c.Get(ctx, unknown); !errors.Is(err, torpor.ErrNotFound) {
		t.Errorf("get of an unknown sandbox: %v; want NOT_FOUND", err)
	}
	if _, err := c.Stop(ctx, unknown); !errors.Is(err, torpor.ErrNotFound) {
		t.Errorf("stop of an unknown sandbox: %v; want NOT_FOUND", err)
	}
	if _, err := c.History(ctx, unknown, 0); !errors.Is(err, torpor.ErrNotFound) {
		t.Errorf("history of an unknown sandbox: %v; want NOT_FOUND", err)
	}
	if _, err := c.waitFor(ctx, unknown, events.PhaseReady); !errors.Is(err, torpor.ErrNotFound) {
		t.Errorf("wait for an unknown sandbox: %v; want NOT_FOUND", err)
	}
	if _, err := c.Stop(ctx, "not-a-uuid"); !errors.Is(err, torpor.ErrInvalidArgument) && !errors.Is(err, torpor.ErrNotFound) {
		t.Errorf("stop of a malformed id: %v; want INVALID_ARGUMENT or NOT_FOUND", err)
	}
	req := sim()
	req.Name = "taken-" + unique()[24:]
	if _, err := c.Create(ctx, req, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, req, ""); !errors.Is(err, torpor.ErrAlreadyExists) {
		t.Errorf("create of a name in use: %v; want ALREADY_EXISTS", err)
	}
	// A driver that cannot suspend: UNIMPLEMENTED, the phase stays.
	nv, err := c.Create(ctx, sim("suspend", "unimplemented"), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.waitFor(ctx, nv.ID, events.PhaseReady); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Suspend(ctx, nv.ID); !errors.Is(err, torpor.ErrUnimplemented) {
		t.Errorf("suspend without the capability: %v; want UNIMPLEMENTED", err)
	}
	// A wait for a phase that a terminal one precludes.
	if _, err := c.Delete(ctx, nv.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.waitFor(ctx, nv.ID, events.PhaseSuspended); !errors.Is(err, torpor.ErrFailedPrecondition) {
		t.Errorf("wait for suspended of a deleted sandbox: %v; want FAILED_PRECONDITION", err)
	}
}

func TestHTTPErrors(t *testing.T) {
	ctx := ctxFor(t)
	checkErrors(t, ctx, httpClient{client()})
	// A wait's own timeout is DEADLINE_EXCEEDED, with the server's word.
	c := client()
	v := mustCreate(t, ctx, c, sim())
	mustWait(t, ctx, c, v.ID, events.PhaseReady)
	if _, err := c.Wait(ctx, v.ID, events.PhaseSuspended, 200*time.Millisecond); !errors.Is(err, torpor.ErrDeadlineExceeded) {
		t.Errorf("wait that times out: %v; want DEADLINE_EXCEEDED", err)
	}
	// A server that is not there: UNAVAILABLE, after the retries.
	gone := torpor.New("127.0.0.1:1", nil)
	if _, err := gone.Get(ctx, v.ID); !errors.Is(err, torpor.ErrUnavailable) {
		t.Errorf("get from no server: %v; want UNAVAILABLE", err)
	}
}

// A create whose answer is lost is sent again with the same key, by the
// client itself, and the sandbox is created once.
func TestHTTPRetrySameKey(t *testing.T) {
	ctx := ctxFor(t)
	p := newProxy(t, server.http)
	wc := torpor.New(p.addr(), nil).WithToken(server.token)
	label := unique()
	req := sim()
	req.Labels = map[string]string{"retry": label}
	p.dropAnswer("HTTP/1.1 201")
	v, err := wc.Create(ctx, req, "")
	if err != nil {
		t.Fatalf("create through a lost answer: %v", err)
	}
	if p.answersDropped() != 1 {
		t.Fatalf("the proxy dropped %d answers; want the first create's", p.answersDropped())
	}
	page, err := client().List(ctx, "", "retry="+label, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 || page.Items[0].ID != v.ID {
		t.Fatalf("list by the create's label: %+v; want the one sandbox %s, created once", page.Items, v.ID)
	}
	// A stop whose answer is lost: one stop in the history.
	mustWait(t, ctx, client(), v.ID, events.PhaseReady)
	p.dropAnswer("HTTP/1.1 202")
	if _, err := wc.Stop(ctx, v.ID); err != nil {
		t.Fatalf("stop through a lost answer: %v", err)
	}
	hist, err := client().History(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range hist {
		if e.Type == "sandbox.stop_requested" {
			n++
		}
	}
	if n != 1 || p.answersDropped() != 2 {
		t.Errorf("%d stop_requested in the history after %d answers lost; want 1 after 2", n, p.answersDropped())
	}
}

// A wait over HTTP whose connection is cut polls again and returns the
// view once the sandbox gets there.
func TestHTTPWaitDroppedConnection(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	p := newProxy(t, server.http)
	wc := torpor.New(p.addr(), nil).WithToken(server.token)
	v := mustCreate(t, ctx, c, sim())
	mustWait(t, ctx, c, v.ID, events.PhaseReady)
	type result struct {
		v   events.View
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := wc.Wait(ctx, v.ID, events.PhaseSuspended, 0)
		done <- result{got, err}
	}()
	for p.connections() < 1 {
		select {
		case <-ctx.Done():
			t.Fatal("the wait never connected")
		case <-time.After(5 * time.Millisecond):
		}
	}
	time.Sleep(50 * time.Millisecond) // let the poll reach the server
	p.cut()
	if _, err := c.Suspend(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.v.Phase != events.PhaseSuspended || r.v.ID != v.ID {
			t.Fatalf("wait through a cut: %+v, %v; want the suspended view", r.v, r.err)
		}
	case <-ctx.Done():
		t.Fatal("the wait did not return")
	}
	if n := p.connections(); n < 2 {
		t.Errorf("the wait made %d connection(s); want a new one after the cut", n)
	}
}

// TestHTTPConnectionsReused: a client made with New(base, nil) keeps its
// connections to the server for the next calls: rounds of 16 calls at once
// open about 16 connections in all, not about 16 per round (Go's default
// transport keeps 2 idle per host and closes the rest).
func TestHTTPConnectionsReused(t *testing.T) {
	ctx := ctxFor(t)
	p := newProxy(t, hostPort(server.http))
	c := torpor.New("http://"+p.addr(), nil).WithToken(server.token)
	const calls, rounds = 16, 5
	for range rounds {
		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for range calls {
			wg.Go(func() {
				if _, err := c.Phases(ctx); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	if n := p.connections(); n > 2*calls {
		t.Fatalf("%d rounds of %d calls at once opened %d connections, want at most %d", rounds, calls, n, 2*calls)
	}
}
