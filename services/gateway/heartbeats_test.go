package gateway

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// bus runs a Bus of a new gateway instance with heartbeat limit limit on
// the rig's server until the test ends.
func (r *rig) bus(t *testing.T, limit time.Duration) *Service {
	t.Helper()
	return r.busOf(t, limit).svc
}

// busOf is bus, returning the Bus.
func (r *rig) busOf(t *testing.T, limit time.Duration) *Bus {
	t.Helper()
	svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{HeartbeatLimit: limit}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	b := NewBus(r.srv.Connect(t), svc, 0, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	if err := b.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return b
}

// sendReport sends a supervisor report of kind on the bus and returns the code
// of its answer ("" taken).
func sendReport(t *testing.T, nc *nats.Conn, id string, gen int64, cred, kind string) events.Code {
	t.Helper()
	body, _ := json.Marshal(compute.Report{SandboxID: id, Generation: gen, Credential: cred, Kind: kind})
	reply, err := nc.Request(compute.ReportSubject(id), body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var eb events.ErrorBody
	if json.Unmarshal(reply.Data, &eb) == nil && eb.Error != nil {
		return eb.Error.Code
	}
	return ""
}

// TestHeartbeats: a supervisor's heartbeat is taken while its generation is
// the attached one (and appends nothing), refused for another generation or
// credential; two gateways share a supervisor's beats (each beat reaches one
// of them), so neither takes it for silent while it beats; once it falls
// silent past the limit it is recorded detached, once. Refused reports are
// counted. Beats published by anyone but a gateway passing on a supervisor's
// report are dropped. A supervisor that
// never heartbeats (the sim's) is never detached.
func TestHeartbeats(t *testing.T) {
	r := newRig(t)
	const limit = 400 * time.Millisecond
	a := r.bus(t, limit)
	b := r.bus(t, limit)
	nc := r.srv.Connect(t)
	ctx := context.Background()
	quiet := readySandbox(t, a) // attached, never beats
	v := readySandbox(t, a)
	cred := r.creds.Mint(v.ID, 1)
	if code := sendReport(t, nc, v.ID, 1, cred, compute.ReportHeartbeat); code != "" {
		t.Fatalf("heartbeat of the attached generation: %q", code)
	}
	if code := sendReport(t, nc, v.ID, 2, r.creds.Mint(v.ID, 2), compute.ReportHeartbeat); code != events.CodeFailedPrecondition {
		t.Fatalf("heartbeat of a generation not attached: %q, want FAILED_PRECONDITION", code)
	}
	if code := sendReport(t, nc, v.ID, 1, "forged", compute.ReportHeartbeat); code != events.CodeUnauthenticated {
		t.Fatalf("heartbeat with a forged credential: %q, want UNAUTHENTICATED", code)
	}
	// Beats published straight on the subject gateways pass them on by,
	// not by the supervisor: a bare generation, a forged report. Neither
	// gets the quiet one watched (nor, once "silent", detached).
	forged, _ := json.Marshal(compute.Report{SandboxID: quiet.ID, Generation: 1, Credential: "forged", Kind: compute.ReportHeartbeat})
	for _, data := range [][]byte{[]byte("1"), forged} {
		if err := nc.Publish(beatPrefix+quiet.ID, data); err != nil {
			t.Fatal(err)
		}
	}
	// Beats at a third of the limit, for three limits: whichever gateway
	// takes each, neither finds the supervisor silent.
	for end := time.Now().Add(3 * limit); time.Now().Before(end); time.Sleep(limit / 3) {
		if code := sendReport(t, nc, v.ID, 1, cred, compute.ReportHeartbeat); code != "" {
			t.Fatalf("heartbeat: %q", code)
		}
	}
	if n := countTypes(t, r.store, v.ID); n[events.TypeSupervisorDetached] != 0 || len(n) != 2 {
		t.Fatalf("log %v while the supervisor beat: want created and attached only", n)
	}
	// Silent now: detached within the limit and a tick.
	deadline := time.Now().Add(10 * time.Second)
	for countTypes(t, r.store, v.ID)[events.TypeSupervisorDetached] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a silent supervisor was not detached")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sb, err := r.service(t).Sandbox(ctx, v.ID); err != nil || sb.Phase != events.PhaseProvisioning {
		t.Fatalf("after the detach: %+v, %v; want provisioning", sb, err)
	}
	if n := countTypes(t, r.store, v.ID)[events.TypeSupervisorDetached]; n != 1 {
		t.Fatalf("detached %d times, want once", n)
	}
	if n := countTypes(t, r.store, quiet.ID); n[events.TypeSupervisorDetached] != 0 {
		t.Fatalf("a supervisor that never beat was detached: %v", n)
	}
	// A heartbeat of the detached supervisor is refused: it must attach again.
	if code := sendReport(t, nc, v.ID, 1, cred, compute.ReportHeartbeat); code != events.CodeFailedPrecondition {
		t.Fatalf("heartbeat after the detach: %q, want FAILED_PRECONDITION", code)
	}
	// Three reports were refused, whichever gateway took each.
	if n := a.ReportsRefused() + b.ReportsRefused(); n != 3 {
		t.Fatalf("refused reports counted %d, want 3", n)
	}
}

// TestHeartbeatAfterDetachElsewhere: a gateway that cached a sandbox while
// its supervisor was attached refuses that supervisor's heartbeat once
// another gateway recorded the detach: the beat is checked at the log's
// head, not against the cache (a CI run under load caught TestHeartbeats'
// last beat taken by the gateway that had not recorded the detach).
func TestHeartbeatAfterDetachElsewhere(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	a, b := r.service(t), r.service(t)
	v := readySandbox(t, a)
	cred := r.creds.Mint(v.ID, 1)
	beat, _ := json.Marshal(compute.Report{SandboxID: v.ID, Generation: 1, Credential: cred, Kind: compute.ReportHeartbeat})
	if _, err := b.Report(ctx, v.ID, beat); err != nil { // b caches the sandbox, attached
		t.Fatalf("heartbeat of the attached generation: %v", err)
	}
	if err := a.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.SupervisorDetached{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Report(ctx, v.ID, beat); events.CodeOf(err) != events.CodeFailedPrecondition {
		t.Fatalf("heartbeat after another gateway recorded the detach: %v, want FAILED_PRECONDITION", err)
	}
}

// TestAttachRenewsTheWatch: an attach taken counts as a beat for every
// gateway that watches its supervisor. A supervisor attached again after
// a detach reaches a gateway whose watch of the silence ended (it found
// it silent), while another still watches the old silence: that one must
// take the attach for a beat, or it finds the supervisor silent in turn
// and detaches it again. The attach was passed on only by a gateway that
// watched the supervisor itself.
func TestAttachRenewsTheWatch(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	a, b := r.busOf(t, time.Hour), r.busOf(t, time.Hour)
	v := readySandbox(t, a.svc)
	cred := r.creds.Mint(v.ID, 1)
	report := func(kind string) *nats.Msg {
		data, _ := json.Marshal(compute.Report{SandboxID: v.ID, Generation: 1, Credential: cred, Kind: kind})
		return &nats.Msg{Subject: compute.ReportSubject(v.ID), Data: data}
	}
	a.report(ctx, report(compute.ReportHeartbeat)) // both gateways watch it
	lastBeat := func(g *Bus) (time.Time, bool) {
		g.beats.mu.Lock()
		defer g.beats.mu.Unlock()
		bt, ok := g.beats.last[v.ID]
		return bt.at, ok
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, g := range []*Bus{a, b} {
		for _, ok := lastBeat(g); !ok; _, ok = lastBeat(g) {
			if time.Now().After(deadline) {
				t.Fatal("the beat was not passed on")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	beat, _ := lastBeat(a)
	if s, _ := b.beats.silent(time.Now().Add(time.Hour), time.Hour, nil); len(s) != 1 { // b found it silent
		t.Fatalf("b found %d supervisors silent, want 1", len(s))
	}
	b.report(ctx, report(compute.ReportAttached)) // taken: it is attached
	for at, _ := lastBeat(a); !at.After(beat); at, _ = lastBeat(a) {
		if time.Now().After(deadline) {
			t.Fatal("the attach taken by a gateway that no longer watched was not taken for a beat by one that does")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, ok := lastBeat(b); ok {
		t.Fatal("the attach made a gateway that did not watch the supervisor watch it")
	}
}

// TestAttachStartsTheWatch: a supervisor that says in its attach that it
// heartbeats is watched from the attach: cut off before its first beat, it
// is recorded detached once the limit passes. Before, only a first beat
// started the watch, and a worker cut off right after its supervisors
// attached left their sandboxes ready for ever.
func TestAttachStartsTheWatch(t *testing.T) {
	r := newRig(t)
	const limit = 300 * time.Millisecond
	a := r.busOf(t, limit)
	ctx := context.Background()
	v, err := a.svc.Handle(ctx, Command{Verb: VerbCreate})
	if err != nil {
		t.Fatal(err)
	}
	envs, err := r.store.Load(ctx, v.ID, 0)
	if err != nil || len(envs) == 0 {
		t.Fatalf("the create: %v %v", envs, err)
	}
	if err := a.svc.Record(ctx, envs[0], "sagas", &events.Started{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(compute.Report{SandboxID: v.ID, Generation: 1, Credential: r.creds.Mint(v.ID, 1), Kind: compute.ReportAttached, Beats: 100})
	reply, err := r.srv.Connect(t).Request(compute.ReportSubject(v.ID), body, 10*time.Second)
	if err != nil || string(reply.Data) != `{"ok":true}` {
		t.Fatalf("the attach: %v %v", reply, err)
	}
	for deadline := time.Now().Add(10 * time.Second); countTypes(t, r.store, v.ID)[events.TypeSupervisorDetached] == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a supervisor that attached and never beat was not recorded detached")
		}
	}
}

// TestSilentExtendedForOutages: a supervisor silent past the heartbeat
// limit is not taken for silent while the log's outage since its last beat
// covers the excess (counted once as extended), and is once the silence
// outlasts the limit and the outage together.
func TestSilentExtendedForOutages(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	var b beats
	b.note("sb", 3, at)
	var asked []time.Time
	out := func(since time.Time) time.Duration { asked = append(asked, since); return 5 * time.Second }
	steps := []struct {
		now      time.Duration
		silent   bool
		extended int
	}{
		{9 * time.Second, false, 0},  // within the limit
		{12 * time.Second, false, 1}, // past it, within the outage: extended
		{14 * time.Second, false, 0}, // still within: not counted again
		{16 * time.Second, true, 0},  // past both
		{30 * time.Second, false, 0}, // taken once, forgotten
	}
	for _, s := range steps {
		got, ext := b.silent(at.Add(s.now), 10*time.Second, out)
		if _, ok := got["sb"]; ok != s.silent || ext != s.extended {
			t.Errorf("at +%s: silent %v extended %d, want %v %d", s.now, ok, ext, s.silent, s.extended)
		}
		if s.silent && got["sb"] != 3 {
			t.Errorf("at +%s: generation %d, want 3", s.now, got["sb"])
		}
	}
	for _, since := range asked {
		if !since.Equal(at) {
			t.Errorf("outage asked since %s, want since the last beat %s", since, at)
		}
	}
	var none beats
	none.note("sb", 1, at)
	if got, _ := none.silent(at.Add(12*time.Second), 10*time.Second, nil); len(got) != 1 {
		t.Errorf("without outages: %d silent, want 1", len(got))
	}
}
