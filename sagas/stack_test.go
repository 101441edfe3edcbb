package sagas_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/sim"
	"github.com/torpor/torpor/services/gateway"
)

// stack is the sagas over a real log: an in-process NATS server's
// JetStream (events/natstest), the gateway deciding the commands and
// judging the sagas' outcomes and the supervisor reports, and a sim driver
// that reports through it. Every append passes through the stack, which
// tells waiters of it.
type stack struct {
	t     *testing.T
	store *jsstore.Store
	svc   *gateway.Service
	sim   *sim.Driver

	mu      sync.Mutex
	changed chan struct{}  // closed and replaced on every append
	tried   map[string]int // the event types the sagas asked to record, answered
}

// newStack starts a stack whose sagas run with deadline and reports, at
// cleanup, every violation the checker finds in the log.
func newStack(t *testing.T, deadline time.Duration) *stack {
	t.Helper()
	return newStackWith(t, deadline, nil)
}

// newStackWith is newStack whose driver is wrap of the sim (the sim
// itself when wrap is nil).
func newStackWith(t *testing.T, deadline time.Duration, wrap func(*sim.Driver) compute.Driver) *stack {
	t.Helper()
	lr := newLogRig(t)
	ctx, store := context.Background(), lr.store
	s := &stack{t: t, store: store, changed: make(chan struct{})}
	var err error
	if s.sim, err = sim.New(reporter{s}, sim.Config{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.sim.Close)
	var drv compute.Driver = s.sim
	if wrap != nil {
		drv = wrap(s.sim)
	}
	drivers := compute.Registry{"sim": drv}
	if s.svc, err = gateway.NewService(store, lr.names, drivers, lr.creds, gateway.Config{Node: node}, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	pos, err := store.Position(ctx, sagas.PositionKey(node))
	if err != nil {
		t.Fatal(err)
	}
	r, err := sagas.New(store, pos, recording{s}, drivers, lr.creds, sagas.Config{Node: node, Deadline: deadline}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, r)
	return s
}

// logRig is a real NATS server with the log and what a gateway keeps
// beside it; the checker runs over the log at cleanup, after every part
// the test starts later has stopped.
type logRig struct {
	srv   *natstest.Server
	store *jsstore.Store
	names *gateway.KVNames
	creds *compute.Credentials
}

func newLogRig(t *testing.T) logRig {
	t.Helper()
	srv := natstest.Start(t)
	ctx := context.Background()
	store, err := jsstore.New(ctx, srv.JS, jsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	names, err := gateway.NewKVNames(ctx, srv.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := compute.NewCredentials([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // registered first: runs last
		vs, err := check.Replay(context.Background(), store, check.Options{})
		if err != nil {
			t.Error(err)
		}
		for _, v := range vs {
			t.Errorf("the log breaks an invariant: %v", v)
		}
	})
	return logRig{srv: srv, store: store, names: names, creds: creds}
}

// runUntilCleanup runs r until the test's cleanup, which waits for it.
func runUntilCleanup(t *testing.T, r *sagas.Runner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
}

func (s *stack) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// recording is the runner's Recorder: the gateway, telling the stack.
type recording struct{ s *stack }

func (r recording) Record(ctx context.Context, cause events.Envelope, actor string, evs ...events.Event) error {
	defer r.s.notify()
	err := r.s.svc.Record(ctx, cause, actor, evs...)
	r.s.mu.Lock()
	if r.s.tried == nil {
		r.s.tried = map[string]int{}
	}
	for _, e := range evs {
		r.s.tried[e.Type()]++
	}
	r.s.mu.Unlock()
	return err
}

// reporter sends the sim's supervisor reports to the gateway, as the bus
// does, telling the stack.
type reporter struct{ s *stack }

func (r reporter) Report(ctx context.Context, rep compute.Report) error {
	defer r.s.notify()
	data, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	_, err = r.s.svc.Report(ctx, rep.SandboxID, data)
	return err
}

// do runs a command through the gateway and returns its answer.
func (s *stack) do(c gateway.Command) (events.View, error) {
	s.t.Helper()
	defer s.notify()
	return s.svc.Handle(context.Background(), c)
}

// view is sandbox id's view as the log holds it now.
func (s *stack) view(id string) events.View {
	s.t.Helper()
	envs, err := s.store.Load(context.Background(), id, 0)
	if err != nil {
		s.t.Fatal(err)
	}
	var v events.View
	for _, env := range envs {
		v.Fold(env)
	}
	return v
}

// await waits until sandbox id's log holds an event after seq that leaves
// it in a phase other than those passed over, and returns the view then.
func (s *stack) await(id string, after uint64, over ...events.Phase) events.View {
	s.t.Helper()
	timeout := time.After(wait)
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		v := s.view(id)
		if v.Seq > after && !phaseIn(v.Phase, over) {
			return v
		}
		select {
		case <-ch:
		case <-timeout:
			s.t.Fatalf("sandbox %s still %s at seq %d: timed out waiting for it to leave %v", id, v.Phase, v.Seq, over)
		}
	}
}

func phaseIn(p events.Phase, ps []events.Phase) bool {
	for _, q := range ps {
		if p == q {
			return true
		}
	}
	return false
}

// suspended creates a sim sandbox with opts, waits until it is ready,
// suspends it and waits until it is suspended.
func (s *stack) suspended(opts map[string]string) events.View {
	s.t.Helper()
	v, err := s.do(gateway.Command{Verb: gateway.VerbCreate, Create: events.CreateRequest{Driver: "sim", DriverOptions: opts}})
	if err != nil {
		s.t.Fatal(err)
	}
	if v = s.await(v.ID, 0, events.PhaseProvisioning); v.Phase != events.PhaseReady {
		s.t.Fatalf("after the create: %s, want ready", v.Phase)
	}
	acc, err := s.do(gateway.Command{Verb: gateway.VerbSuspend, ID: v.ID})
	if err != nil {
		s.t.Fatal(err)
	}
	if v = s.await(v.ID, acc.Seq, events.PhaseSuspending); v.Phase != events.PhaseSuspended || !v.Restore.Held {
		s.t.Fatalf("after the suspend: %+v, want suspended, the state held", v)
	}
	return v
}

// TestLateResumeAnswerAfterConsumption (issue 24, hole 2): the driver
// consumes the retained state, its restore fails, and its answer comes
// only after the resume's deadline (the sim's resume=fail_after_consume,
// answer_delay=1s, under a 300 ms deadline). The answer says what it
// says: consumed, so the sandbox takes the path after the consumption
// (stopped, RetainedStateLost) and is never suspended again on the
// consumed reference. It used to go back to suspended with the state
// held, and every later resume failed with "consumed by generation 2".
func TestLateResumeAnswerAfterConsumption(t *testing.T) {
	s := newStack(t, 300*time.Millisecond)
	v := s.suspended(map[string]string{"resume": "fail_after_consume", "answer_delay": "1s"})
	acc, err := s.do(gateway.Command{Verb: gateway.VerbResume, ID: v.ID})
	if err != nil {
		t.Fatal(err)
	}
	got := s.await(v.ID, acc.Seq, events.PhaseStarting)
	want := events.View{Phase: events.PhaseStopped, Restore: events.Restore{Consumed: true}, Reason: events.ReasonRetainedStateLost, LastOutcome: events.OutcomeRestoreFailed}
	if got.Phase != want.Phase || got.Restore != want.Restore || got.Reason != want.Reason || got.LastOutcome != want.LastOutcome {
		t.Fatalf("after the resume: phase %s, restore %+v, reason %q, outcome %q; want phase %s, restore %+v, reason %q, outcome %q",
			got.Phase, got.Restore, got.Reason, got.LastOutcome, want.Phase, want.Restore, want.Reason, want.LastOutcome)
	}
}

// TestDeadlineCleanupThroughTheGateway (issue 24, hole 7): through the
// gateway, a provisioning deadline ends in error with its clean-up asked in
// the same append, and the driver's confirmation is recorded in error: the
// workload that never attached is stopped, and the log says so.
func TestDeadlineCleanupThroughTheGateway(t *testing.T) {
	s := newStack(t, 300*time.Millisecond)
	v, err := s.do(gateway.Command{Verb: gateway.VerbCreate, Create: events.CreateRequest{Driver: "sim", DriverOptions: map[string]string{"attach": "never"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.await(v.ID, v.Seq, events.PhaseProvisioning); got.Phase != events.PhaseError || got.Reason != events.ReasonDeadlineExceeded {
		t.Fatalf("after the deadline: phase %s, reason %q; want error, DeadlineExceeded", got.Phase, got.Reason)
	}
	var types []string
	timeout := time.After(wait)
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		envs, err := s.store.Load(context.Background(), v.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		types = types[:0]
		for _, e := range envs {
			types = append(types, e.Type)
		}
		if slices.Contains(types, events.TypeCleanedUp) {
			break
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("the log %v never confirms the clean-up", types)
		}
	}
	want := []string{events.TypeCreated, events.TypeStarted, events.TypeDeadlinePassed, events.TypeCleanupRequested, events.TypeCleanedUp}
	if !slices.Equal(types, want) {
		t.Fatalf("the log %v, want %v", types, want)
	}
	if o, _ := s.sim.Observe(context.Background(), compute.Spec{SandboxID: v.ID}); o.State != compute.StateStopped {
		t.Fatalf("the sim observes %+v, want the workload stopped", o)
	}
	if got := s.view(v.ID); got.Phase != events.PhaseError {
		t.Fatalf("after the clean-up: %s, want error", got.Phase)
	}
}

// lateSuspender is the sim whose suspensions wait for release, whatever
// their call's context says, as a remote node that took the call late.
type lateSuspender struct {
	*sim.Driver
	entered chan struct{}
	release chan struct{}
}

func (d *lateSuspender) Suspend(ctx context.Context, t compute.Target) (string, error) {
	d.entered <- struct{}{}
	<-d.release
	return d.Driver.Suspend(ctx, t)
}

// TestLateSuspendAnswerThroughTheGateway (issue 24, hole 9): through the
// gateway, a suspension that answers after its deadline settled the
// sandbox back to ready (the workload running then) is refused as an
// outcome, and its reference is released by resuming it in place: the view
// says ready, and the workload runs.
func TestLateSuspendAnswerThroughTheGateway(t *testing.T) {
	late := &lateSuspender{entered: make(chan struct{}, 4), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(late.release) }) }
	s := newStackWith(t, 300*time.Millisecond, func(d *sim.Driver) compute.Driver {
		late.Driver = d
		return late
	})
	t.Cleanup(release) // before the runner stops
	v, err := s.do(gateway.Command{Verb: gateway.VerbCreate, Create: events.CreateRequest{Driver: "sim"}})
	if err != nil {
		t.Fatal(err)
	}
	if v = s.await(v.ID, 0, events.PhaseProvisioning); v.Phase != events.PhaseReady {
		t.Fatalf("after the create: %s, want ready", v.Phase)
	}
	acc, err := s.do(gateway.Command{Verb: gateway.VerbSuspend, ID: v.ID})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-late.entered:
	case <-time.After(wait):
		t.Fatal("the suspend never reached the driver")
	}
	if got := s.await(v.ID, acc.Seq, events.PhaseSuspending); got.Phase != events.PhaseReady || got.LastOutcome != events.OutcomeSuspendTimedOut {
		t.Fatalf("after the deadline: phase %s, outcome %q; want ready, %s", got.Phase, got.LastOutcome, events.OutcomeSuspendTimedOut)
	}
	release()
	timeout := time.After(wait)
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		o, err := s.sim.Observe(context.Background(), compute.Spec{SandboxID: v.ID})
		if err != nil {
			t.Fatal(err)
		}
		if o.State == compute.StateRunning && o.Consumed != "" {
			break // frozen, then resumed in place: its reference consumed
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("the sim observes %+v: the late reference never released", o)
		}
	}
	if got := s.view(v.ID); got.Phase != events.PhaseReady || got.Restore.Held || got.Generation != 1 {
		t.Fatalf("after the late answer: %+v, want ready at generation 1, nothing held", got)
	}
}
