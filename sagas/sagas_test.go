package sagas_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/sim"
)

const node = "n1"

// harness is a log, a recorder and a sim driver that runners are started on.
type harness struct {
	t       *testing.T
	store   *tracked
	rec     *recorder
	sim     *sim.Driver
	reports *reports
	creds   *compute.Credentials
	cfg     sagas.Config
	// expected are violations a test makes on purpose (forged events):
	// each must be found, and is no error.
	expected []func(check.Violation) bool
}

// expect says the checker must find a violation v satisfies in the log.
func (h *harness) expect(v func(check.Violation) bool) { h.expected = append(h.expected, v) }

func newHarness(t *testing.T, cfg sagas.Config) *harness {
	t.Helper()
	if cfg.Node == "" {
		cfg.Node = node
	}
	if cfg.CheckpointEvery == 0 {
		cfg.CheckpointEvery = time.Millisecond
	}
	creds, err := compute.NewCredentials([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	store := newTracked()
	rep := &reports{}
	d, err := sim.New(rep, sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	h := &harness{t: t, store: store, rec: &recorder{store: store}, sim: d, reports: rep, creds: creds, cfg: cfg}
	// Registered first, so it runs last: after every runner stopped.
	t.Cleanup(func() { h.checkLog() })
	return h
}

// checkLog runs the invariant checker over every sandbox's log.
func (h *harness) checkLog() {
	h.t.Helper()
	if last, err := h.store.LastSeq(context.Background()); err != nil || last == 0 {
		return // nothing to read (Follow would wait for a first event)
	}
	var log []events.Envelope
	_ = h.store.Store.Follow(context.Background(), 0, 1000, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
		log = append(log, envs...)
		if pending == 0 {
			return errDone
		}
		return nil
	})
	found := make([]bool, len(h.expected))
	for _, v := range check.All(log, check.Options{}) {
		i := slices.IndexFunc(h.expected, func(e func(check.Violation) bool) bool { return e(v) })
		if i < 0 {
			h.t.Errorf("the log breaks an invariant: %v", v)
			continue
		}
		found[i] = true
	}
	for i, f := range found {
		if !f {
			h.t.Errorf("the checker missed the violation the test made on purpose (%d)", i)
		}
	}
}

var errDone = errors.New("read to the head")

// run starts a Runner driving drv and returns a function that stops it and
// waits for Run to return (also called at cleanup).
func (h *harness) run(drv compute.Driver) (stop func()) {
	h.t.Helper()
	_, stop = h.start(drv)
	return stop
}

// start is run that also returns the Runner.
func (h *harness) start(drv compute.Driver) (r *sagas.Runner, stop func()) {
	h.t.Helper()
	r, err := sagas.New(h.store, position{h.store}, h.rec, compute.Registry{"sim": drv}, h.creds, h.cfg, zerolog.New(zerolog.NewTestWriter(h.t)))
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("Run = %v, want nil", err)
				}
			case <-time.After(wait):
				h.t.Error("Run did not return after its context ended")
			}
		})
	}
	h.t.Cleanup(stop)
	return r, stop
}

// sandbox is one sandbox's log as the test writes it: non-intent events
// given after an intent count as its outcome (caused by it).
type sandbox struct {
	h      *harness
	id     string
	intent events.Envelope
}

// create appends sandbox.created (generation 1) on node n with opts.
func (h *harness) create(n string, opts map[string]string) (*sandbox, events.Envelope) {
	h.t.Helper()
	sb := &sandbox{h: h, id: uuid.Must(uuid.NewV7()).String()}
	env := sb.when(&events.Created{Name: "sb", Driver: "sim", Node: n, DriverOptions: opts, Generation: 1})
	return sb, env
}

// given appends evs one by one, each non-intent event caused by the last
// intent, as if its saga had recorded it.
func (sb *sandbox) given(evs ...events.Event) {
	sb.h.t.Helper()
	for _, e := range evs {
		sb.append(e)
	}
}

// when appends intent e (and extras in the same append, as the gateway does
// for an explicit start of a suspended sandbox) and returns its envelope.
func (sb *sandbox) when(e events.Event, extras ...events.Event) events.Envelope {
	sb.h.t.Helper()
	envs := sb.append(append([]events.Event{e}, extras...)...)
	return envs[0]
}

func (sb *sandbox) append(evs ...events.Event) []events.Envelope {
	sb.h.t.Helper()
	envs := make([]events.Envelope, len(evs))
	for i, e := range evs {
		meta := events.Meta{Actor: "test", CommandID: uuid.NewString()}
		if !isIntent(e) && sb.intent.ID != "" && i == 0 {
			meta = sb.intent.Caused("test")
		}
		env, err := events.NewEnvelope(sb.id, e, meta, time.Now())
		if err != nil {
			sb.h.t.Fatal(err)
		}
		envs[i] = env
	}
	envs, err := sb.h.store.appendNext(context.Background(), sb.id, false, envs...)
	if err != nil {
		sb.h.t.Fatal(err)
	}
	if isIntent(evs[0]) {
		sb.intent = envs[0]
	}
	return envs
}

func isIntent(e events.Event) bool {
	switch e.(type) {
	case *events.Created, *events.StartRequested, *events.StopRequested, *events.SuspendRequested, *events.ResumeRequested, *events.DeleteRequested:
		return true
	}
	return false
}

// outcome waits until the log holds n events caused by intent and returns
// them decoded.
func (sb *sandbox) outcome(intent events.Envelope, n int) []events.Event {
	sb.h.t.Helper()
	var got []events.Envelope
	sb.h.store.waitUntil(sb.h.t, "the outcome of "+intent.Type, func() bool {
		got = sb.causedBy(intent)
		return len(got) >= n
	})
	out := make([]events.Event, len(got))
	for i, env := range got {
		e, err := env.Decode()
		if err != nil {
			sb.h.t.Fatal(err)
		}
		out[i] = e
	}
	return out
}

func (sb *sandbox) causedBy(intent events.Envelope) []events.Envelope {
	all, err := sb.h.store.Load(context.Background(), sb.id, 0)
	if err != nil {
		sb.h.t.Fatal(err)
	}
	var got []events.Envelope
	for _, env := range all {
		if env.CausationID == intent.ID {
			got = append(got, env)
		}
	}
	return got
}

// then checks events against want, fields included; a SuspendRejected or
// failure Message is only checked for being non-empty, a Suspended
// RestoreRef for its sim prefix.
func (sb *sandbox) then(got []events.Event, want ...events.Event) {
	sb.h.t.Helper()
	if len(got) != len(want) {
		sb.h.t.Fatalf("outcome = %s, want %s", describe(got), describe(want))
	}
	for i := range got {
		g := normalise(sb.h.t, sb.id, got[i])
		if !reflect.DeepEqual(g, want[i]) {
			sb.h.t.Fatalf("outcome[%d] = %#v, want %#v", i, g, want[i])
		}
	}
}

func normalise(t *testing.T, id string, e events.Event) events.Event {
	t.Helper()
	switch e := e.(type) {
	case *events.SuspendRejected:
		if e.Message == "" {
			t.Errorf("%s without a message", e.Type())
		}
		c := *e
		c.Message = ""
		return &c
	case *events.ResumeFailed:
		if e.Message == "" {
			t.Errorf("%s without a message", e.Type())
		}
		c := *e
		c.Message = ""
		return &c
	case *events.StartFailed:
		if e.Message == "" {
			t.Errorf("%s without a message", e.Type())
		}
		c := *e
		c.Message = ""
		return &c
	case *events.ResourceLost:
		c := *e
		c.Message = ""
		return &c
	case *events.StopRejected:
		if e.Message == "" {
			t.Errorf("%s without a message", e.Type())
		}
		c := *e
		c.Message = ""
		return &c
	case *events.Suspended:
		if !strings.HasPrefix(e.RestoreRef, "sim:"+id+":") {
			t.Errorf("restore ref %q, want sim:%s:…", e.RestoreRef, id)
		}
		c := *e
		c.RestoreRef = ""
		return &c
	}
	return e
}

func describe(evs []events.Event) string {
	s := make([]string, len(evs))
	for i, e := range evs {
		s[i] = e.Type()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// ready is the log of a created and started sandbox of generation 1, with
// the sim running it as the create saga would have had it.
func (h *harness) ready(opts map[string]string) *sandbox {
	h.t.Helper()
	sb, _ := h.create(node, opts)
	spec := compute.Spec{SandboxID: sb.id, Node: node, Options: opts}
	if err := h.sim.Start(context.Background(), compute.Start{Spec: spec, Generation: 1, Credential: h.creds.Mint(sb.id, 1)}); err != nil {
		h.t.Fatalf("sim start: %v", err)
	}
	sb.given(&events.Started{Generation: 1}, &events.SupervisorAttached{Generation: 1})
	return sb
}

// suspended is the log of a sandbox suspended at generation 1 behind ref,
// the sim holding its retained state.
func (h *harness) suspended(opts map[string]string) (*sandbox, string) {
	h.t.Helper()
	sb := h.ready(opts)
	ref, err := h.sim.Suspend(context.Background(), compute.Target{Spec: compute.Spec{SandboxID: sb.id, Node: node, Options: opts}, Generation: 1})
	if err != nil {
		h.t.Fatalf("sim suspend: %v", err)
	}
	sb.given(&events.SuspendRequested{Generation: 1}, &events.Suspended{Generation: 1, RestoreRef: ref})
	return sb, ref
}

func TestCreateStartsTheFirstGeneration(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	drv := newCounting(h.sim, "")
	h.run(drv)
	sb, created := h.create(node, nil)
	sb.then(sb.outcome(created, 1), &events.Started{Generation: 1})
	// The sim's supervisor attached with the credential minted for generation 1.
	rep := h.reports.waitFor(t, 1)[0]
	if rep.Kind != compute.ReportAttached || rep.Generation != 1 || !h.creds.Verify(sb.id, 1, rep.Credential) {
		t.Fatalf("report = %+v, want an attach of generation 1 with its credential", rep)
	}
}

func TestStartFromStopped(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb := h.ready(nil)
	sb.given(&events.StopRequested{Generation: 1}, &events.Stopped{Generation: 1})
	h.run(newCounting(h.sim, ""))
	in := sb.when(&events.StartRequested{Generation: 2})
	sb.then(sb.outcome(in, 1), &events.Started{Generation: 2})
}

// TestStartDiscardsWhenTheReadingSplitsTheBatch: a reading of the log that
// hands the start intent over alone, as the head, and the discard
// appended with it only after the start saga began, still has the
// retained state discarded (the saga looks in the log).
func TestStartDiscardsWhenTheReadingSplitsTheBatch(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(nil)
	last, err := h.store.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h.store.mu.Lock()
	h.store.splitAt, h.store.splitPause = last+1, 300*time.Millisecond
	h.store.mu.Unlock()
	drv := newCounting(h.sim, "")
	h.run(drv)
	in := sb.when(&events.StartRequested{Generation: 2}, &events.RetainedStateDiscarded{RestoreRef: ref})
	if in.Seq != last+1 {
		t.Fatalf("the intent is at %d, want %d", in.Seq, last+1)
	}
	sb.then(sb.outcome(in, 1), &events.Started{Generation: 2})
	if got := drv.count("discard"); got != 1 {
		t.Fatalf("discard calls = %d, want 1", got)
	}
}

func TestExplicitStartOfSuspendedDiscardsTheRetainedState(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(nil)
	drv := newCounting(h.sim, "")
	h.run(drv)
	in := sb.when(&events.StartRequested{Generation: 2}, &events.RetainedStateDiscarded{RestoreRef: ref})
	sb.then(sb.outcome(in, 1), &events.Started{Generation: 2})
	if got := drv.count("discard"); got != 1 {
		t.Fatalf("discard calls = %d, want 1", got)
	}
}

func TestStartFailsWithBadOptions(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	h.run(newCounting(h.sim, ""))
	sb, created := h.create(node, map[string]string{"suspend": "maybe"})
	sb.then(sb.outcome(created, 1), &events.StartFailed{Generation: 1})
}

func TestStop(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb := h.ready(nil)
	h.run(newCounting(h.sim, ""))
	in := sb.when(&events.StopRequested{Generation: 1})
	sb.then(sb.outcome(in, 1), &events.Stopped{Generation: 1})
}

// TestNoGoroutineOutlivesRun: the goroutine a step ran on waits for the
// next one only while the runner runs; when Run returns it has ended, long
// before its keep-alive.
func TestNoGoroutineOutlivesRun(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb := h.ready(nil)
	r, stop := h.start(newCounting(h.sim, ""))
	in := sb.when(&events.StopRequested{Generation: 1})
	sb.then(sb.outcome(in, 1), &events.Stopped{Generation: 1})
	if sagas.WarmLive(r) == 0 {
		t.Fatal("no goroutine in the pool after a step; the test would prove nothing")
	}
	stop()
	if got := sagas.WarmLive(r); got != 0 {
		t.Errorf("%d goroutines of the pool left after Run returned, want 0", got)
	}
}

func TestSuspend(t *testing.T) {
	cases := []struct {
		name     string
		opts     map[string]string
		deadline time.Duration
		want     []events.Event
	}{
		{"ok", nil, 0, []events.Event{&events.Suspended{Generation: 1}}},
		{"rejected", map[string]string{"suspend": "reject"}, 0, []events.Event{
			&events.SuspendRejected{Generation: 1, Reason: events.ReasonSuspendRejected},
		}},
		{"unimplemented", map[string]string{"suspend": "unimplemented"}, 0, []events.Event{
			&events.SuspendRejected{Generation: 1, Reason: events.ReasonSuspendRejected},
		}},
		{"hang passes the deadline, the workload running", map[string]string{"suspend": "hang"}, 50 * time.Millisecond, []events.Event{
			&events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded},
			&events.DeadlinePassed{Phase: events.PhaseSuspending, Deadline: "50ms"},
		}},
		{"exit during suspend still answers a reference", map[string]string{"exit_during_suspend": "9"}, 0, []events.Event{
			&events.Suspended{Generation: 1},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, sagas.Config{Deadline: c.deadline})
			sb := h.ready(c.opts)
			h.run(newCounting(h.sim, ""))
			in := sb.when(&events.SuspendRequested{Generation: 1})
			sb.then(sb.outcome(in, len(c.want)), c.want...)
			if got := h.rec.callsOf(c.want[0].Type()); got != 1 {
				t.Fatalf("record calls with %s = %d, want 1 (one atomic record)", c.want[0].Type(), got)
			}
		})
	}
}

// TestSuspendRefusedDiscardsTheReference: an exit of the workload lands
// while the suspend is under way; the saga's record of the suspension is
// refused (the sandbox is in error, its exit code kept) and the reference
// the driver returned late is released.
func TestSuspendRefusedDiscardsTheReference(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb := h.ready(nil)
	drv := newCounting(h.sim, "suspend")
	h.run(drv)
	sb.when(&events.SuspendRequested{Generation: 1})
	select {
	case <-drv.entered:
	case <-time.After(wait):
		t.Fatal("the suspend never reached the driver")
	}
	exited := sb.when(&events.Exited{Generation: 1, Code: 137})
	close(drv.release)
	h.store.waitPast(t, exited.Seq)
	h.store.waitUntil(t, "the discard", func() bool { return drv.count("discard") == 1 })
	all, _ := h.store.Load(context.Background(), sb.id, 0)
	for _, e := range all {
		if e.Type == events.TypeSuspended {
			t.Fatalf("sandbox.suspended recorded after the exit: %+v", e)
		}
	}
	if got := h.rec.callsOf(events.TypeSuspended); got != 1 {
		t.Fatalf("suspended offered %d times, want once (refused, then released)", got)
	}
}

func TestResume(t *testing.T) {
	consumed := func(ref string) *events.RetainedStateConsumed {
		return &events.RetainedStateConsumed{Generation: 2, RestoreRef: ref}
	}
	cases := []struct {
		name    string
		mode    string
		restart bool
		want    func(ref string) []events.Event
	}{
		{"restored", "ok", false, func(ref string) []events.Event {
			return []events.Event{consumed(ref), &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}}
		}},
		{"fails before consuming", "fail", true, func(string) []events.Event {
			return []events.Event{&events.ResumeFailed{Generation: 2}}
		}},
		{"fails after consuming, strict", "fail_after_consume", false, func(ref string) []events.Event {
			return []events.Event{consumed(ref), &events.Stopped{Generation: 2, Reason: events.ReasonRetainedStateLost}}
		}},
		{"fails after consuming, restart", "fail_after_consume", true, func(ref string) []events.Event {
			return []events.Event{consumed(ref), &events.StartRequested{Generation: 3, Fallback: true}}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, sagas.Config{})
			sb, ref := h.suspended(map[string]string{"resume": c.mode})
			h.run(newCounting(h.sim, ""))
			in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, RestartIfRestoreFails: c.restart})
			want := c.want(ref)
			out := sb.outcome(in, len(want))
			sb.then(out, want...)
			if c.restart && c.mode == "fail_after_consume" {
				// The fallback is an intent of its own: the start saga cold-starts it.
				fallback := sb.causedBy(in)[1]
				sb.then(sb.outcome(fallback, 1), &events.Started{Generation: 3})
			}
		})
	}
}

// TestResumeOfAnUnknownReference (issue 24, hole 2): a driver that holds
// nothing behind the reference (consumed by an earlier resume whose answer
// was lost, discarded, never made) gets no suspended sandbox back on it,
// where every later resume would fail the same way: the path after a
// consumption, the state lost (or the fallback's cold start).
func TestResumeOfAnUnknownReference(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart_if_restore_fails=%t", restart), func(t *testing.T) {
			h := newHarness(t, sagas.Config{})
			sb, ref := h.suspended(nil)
			if err := h.sim.Discard(context.Background(), compute.Spec{SandboxID: sb.id, Node: node}, ref); err != nil {
				t.Fatal(err)
			}
			h.run(newCounting(h.sim, ""))
			in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, RestartIfRestoreFails: restart})
			var then events.Event = &events.Stopped{Generation: 2, Reason: events.ReasonRetainedStateLost}
			if restart {
				then = &events.StartRequested{Generation: 3, Fallback: true}
			}
			sb.then(sb.outcome(in, 2), &events.RetainedStateConsumed{Generation: 2, RestoreRef: ref}, then)
		})
	}
}

func TestResumeFailOnceThenRestores(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(map[string]string{"resume": "fail_once"})
	h.run(newCounting(h.sim, ""))
	first := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.then(sb.outcome(first, 1), &events.ResumeFailed{Generation: 2})
	second := sb.when(&events.ResumeRequested{Generation: 3, RestoreRef: ref})
	sb.then(sb.outcome(second, 2),
		&events.RetainedStateConsumed{Generation: 3, RestoreRef: ref},
		&events.Resumed{Generation: 3, Outcome: events.OutcomeRestored})
}

func TestDelete(t *testing.T) {
	t.Run("without a retained state", func(t *testing.T) {
		h := newHarness(t, sagas.Config{})
		sb := h.ready(nil)
		h.run(newCounting(h.sim, ""))
		in := sb.when(&events.DeleteRequested{})
		sb.then(sb.outcome(in, 1), &events.Deleted{})
	})
	t.Run("invalidates a held retained state", func(t *testing.T) {
		h := newHarness(t, sagas.Config{})
		sb, ref := h.suspended(nil)
		h.run(newCounting(h.sim, ""))
		in := sb.when(&events.DeleteRequested{})
		sb.then(sb.outcome(in, 2), &events.RetainedStateInvalidated{RestoreRef: ref}, &events.Deleted{})
	})
	t.Run("after a consumed state invalidates nothing", func(t *testing.T) {
		h := newHarness(t, sagas.Config{})
		sb, ref := h.suspended(nil)
		sb.given(&events.ResumeRequested{Generation: 2, RestoreRef: ref},
			&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref},
			&events.Resumed{Generation: 2, Outcome: events.OutcomeRestored})
		h.run(newCounting(h.sim, ""))
		in := sb.when(&events.DeleteRequested{})
		sb.then(sb.outcome(in, 1), &events.Deleted{})
	})
}

func TestSettledIntentsAreNotDrivenAgain(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(nil)
	// A suspend whose outcome is missing but that a later intent superseded.
	sb.given(&events.ResumeRequested{Generation: 2, RestoreRef: ref},
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref},
		&events.Resumed{Generation: 2, Outcome: events.OutcomeRestored},
		&events.SupervisorAttached{Generation: 2})
	superseded := sb.when(&events.SuspendRequested{Generation: 2})
	last := sb.when(&events.DeleteRequested{})
	drv := newCounting(h.sim, "")
	h.run(drv)
	sb.then(sb.outcome(last, 1), &events.Deleted{})
	h.store.waitPast(t, last.Seq)
	if drv.count("delete") != 1 || drv.total() != 1 {
		t.Fatalf("driver calls = %v, want one delete only", drv.calls)
	}
	if got := sb.causedBy(superseded); len(got) != 0 {
		t.Fatalf("superseded intent recorded %d events", len(got))
	}
}

// TestQueuedIntentsLearnFromTheLog: intents that wait behind a slow step get
// what followed them from the log the runner reads, so once the runner has
// caught up they need no round trip to the store: a stop superseded by a
// delete while it waited is skipped, and the delete is driven.
func TestQueuedIntentsLearnFromTheLog(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb := h.ready(nil)
	drv := newCounting(h.sim, "suspend")
	h.run(drv)
	setup, _ := h.store.LastSeq(context.Background())
	h.store.waitPast(t, setup)
	loads := h.store.laterLoads()

	suspend := sb.when(&events.SuspendRequested{Generation: 1})
	select {
	case <-drv.entered:
	case <-time.After(wait):
		t.Fatal("the suspend never reached the driver")
	}
	stop := sb.when(&events.StopRequested{Generation: 1})
	del := sb.when(&events.DeleteRequested{})
	// The runner reads both while the suspend is still under way.
	h.store.waitUntil(t, "the runner to read the delete", func() bool { return h.store.followed() >= del.Seq })
	close(drv.release)
	sb.then(sb.outcome(del, 1), &events.Deleted{})
	h.store.waitPast(t, del.Seq)

	// The suspension the driver made came too late: the sandbox is deleting,
	// the record is refused, and the reference is released.
	if got := sb.causedBy(suspend); len(got) != 0 {
		t.Errorf("suspend outcome %v, want none (refused in deleting)", got)
	}
	if got := drv.count("discard"); got != 1 {
		t.Errorf("discard calls %d, want 1: the late reference released", got)
	}
	if got := sb.causedBy(stop); len(got) != 0 {
		t.Errorf("superseded stop recorded %d events", len(got))
	}
	if drv.count("stop") != 0 || drv.count("delete") != 1 {
		t.Errorf("driver calls = %v, want one delete and no stop", drv.calls)
	}
	if got := h.store.laterLoads() - loads; got != 0 {
		t.Errorf("%d loads of later events, want none: the runner had read them", got)
	}
}

// TestFollowIsRetried: when the log cannot be followed, the runner follows
// it again (after a backoff) from where it stood; nothing is lost or driven
// twice.
func TestFollowIsRetried(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb := h.ready(nil)
	setup, _ := h.store.LastSeq(context.Background())
	h.store.failFollow = 2  // the first two calls fail at once
	h.store.breakAt = setup // the third breaks once it handed the setup
	drv := newCounting(h.sim, "")
	h.run(drv)
	h.store.waitUntil(t, "a fourth follow", func() bool {
		h.store.mu.Lock()
		defer h.store.mu.Unlock()
		return len(h.store.follows) == 4
	})
	in := sb.when(&events.StopRequested{Generation: 1})
	sb.then(sb.outcome(in, 1), &events.Stopped{Generation: 1})
	h.store.mu.Lock()
	follows := append([]uint64(nil), h.store.follows...)
	h.store.mu.Unlock()
	if want := []uint64{0, 0, 0, setup}; !reflect.DeepEqual(follows, want) {
		t.Errorf("followed from %v, want %v", follows, want)
	}
	if drv.count("stop") != 1 || drv.count("start") != 0 {
		t.Errorf("driver calls %v, want the one stop", drv.calls)
	}
}

func TestRecordIsRetriedWhileTheLogIsUnavailable(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	h.rec.unavailable = 3
	sb := h.ready(nil)
	drv := newCounting(h.sim, "")
	h.run(drv)
	in := sb.when(&events.StopRequested{Generation: 1})
	sb.then(sb.outcome(in, 1), &events.Stopped{Generation: 1})
	if got := h.rec.callsOf(events.TypeStopped); got != 4 {
		t.Fatalf("record calls = %d, want 4 (3 unavailable, then recorded)", got)
	}
	if got := drv.count("stop"); got != 1 {
		t.Fatalf("stop calls = %d, want 1", got)
	}
}

func TestOtherNodesAreLeftAlone(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	drv := newCounting(h.sim, "")
	h.run(drv)
	other, created := h.create("n2", nil)
	h.store.waitPast(t, created.Seq)
	in := other.when(&events.DeleteRequested{})
	h.store.waitPast(t, in.Seq)
	if drv.total() != 0 {
		t.Fatalf("driver calls = %v, want none", drv.calls)
	}
	if got, _ := h.store.Load(context.Background(), other.id, 0); len(got) != 2 {
		t.Fatalf("log has %d events, want the 2 appended", len(got))
	}
}

func TestSandboxesRunInParallel(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	// One sandbox's suspend hangs until the runner stops; another's create
	// goes through meanwhile.
	drv := newCounting(h.sim, "suspend")
	// Laid before the runner starts: laid while it runs, its create saga
	// could record started before the harness does, which answers the
	// create twice (the checker's invariant 4, seen in CI under load).
	slow := h.ready(nil)
	h.run(drv)
	slow.when(&events.SuspendRequested{Generation: 1})
	<-drv.entered
	sb, created := h.create(node, nil)
	sb.then(sb.outcome(created, 1), &events.Started{Generation: 1})
}

func TestCrashRecoveryRedrivesAnUnfinishedIntent(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb := h.ready(nil)

	// The first runner gets the intent to the driver, which never answers;
	// then the service stops.
	blocked := newCounting(h.sim, "suspend")
	stop := h.run(blocked)
	in := sb.when(&events.SuspendRequested{Generation: 1})
	select {
	case <-blocked.entered:
	case <-time.After(wait):
		t.Fatal("the suspend never reached the driver")
	}
	stop()
	if got := h.store.saved(); got >= in.Seq {
		t.Fatalf("position saved at %d, past the unfinished intent at %d", got, in.Seq)
	}
	if got := sb.causedBy(in); len(got) != 0 {
		t.Fatalf("recorded %d events before the restart, want none", len(got))
	}

	// A new runner on the same log re-drives it.
	drv := newCounting(h.sim, "")
	h.run(drv)
	sb.then(sb.outcome(in, 1), &events.Suspended{Generation: 1})
	h.store.waitPast(t, in.Seq)
	if got := drv.count("suspend"); got != 1 {
		t.Fatalf("suspend calls after the restart = %d, want 1", got)
	}
	if got := h.rec.callsOf(events.TypeSuspended); got != 1 {
		t.Fatalf("suspended recorded %d times, want once", got)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  sagas.Config
		ok   bool
	}{
		{"defaults", sagas.Config{Node: "n1"}, true},
		{"no node", sagas.Config{}, false},
		{"negative deadline", sagas.Config{Node: "n1", Deadline: -time.Second}, false},
		{"negative workers", sagas.Config{Node: "n1", Workers: -1}, false},
	}
	for _, c := range cases {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate = %v, want ok %v", c.name, err, c.ok)
		}
	}
}

// TestResumeWithOnlyTheConsumptionRecordedIsRedriven: the consumption is
// recorded on its own before the outcome; a crash between the two leaves an
// intent that is not settled, and a restarted runner records the outcome
// (the driver's resume is idempotent for the same generation and reference).
func TestResumeWithOnlyTheConsumptionRecordedIsRedriven(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(nil)
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.given(&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref}) // the crash came here
	drv := newCounting(h.sim, "")
	h.run(drv)
	// The re-drive says the consumption again, which the recorder leaves
	// out as the gateway does, and records the outcome.
	out := sb.outcome(in, 2)
	if got := out[len(out)-1]; got.Type() != "sandbox.resumed" {
		t.Fatalf("last outcome %s, want sandbox.resumed", got.Type())
	}
	if n := drv.count("resume"); n != 1 {
		t.Fatalf("driver resume called %d times, want 1 (the re-drive)", n)
	}
}
