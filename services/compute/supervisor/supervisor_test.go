package supervisor_test

import (
	"context"
	"encoding/json"

	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/supervisor"
	"github.com/torpor/torpor/services/gateway"
)

// wait bounds every wait of these tests.
const wait = 10 * time.Second

// TestSendAnswers: what Send makes of each answer a gateway may give. A
// refusal is final only when sending the report again cannot change it;
// an error of the moment (an append that failed, a conflict retried out)
// or no answer at all means the report is to be sent again: counted as
// answered, it was dropped and lost (an attach, an exit).
func TestSendAnswers(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Conn
	s := &supervisor.Sender{NC: nc, Log: zerolog.Nop()}
	for _, tc := range []struct {
		code events.Code // "" taken
		want supervisor.Answer
	}{
		{"", supervisor.Taken},
		{events.CodeFailedPrecondition, supervisor.Refused},
		{events.CodeUnauthenticated, supervisor.Refused},
		{events.CodeInvalidArgument, supervisor.Refused},
		{events.CodeNotFound, supervisor.Refused},
		{events.CodeUnavailable, supervisor.Again},
		{events.CodeAborted, supervisor.Again},
		{events.CodeInternal, supervisor.Again},
		{events.CodeDeadlineExceeded, supervisor.Again},
	} {
		t.Run(string(tc.code), func(t *testing.T) {
			id := "0193b0a4-7c1e-7a4e-9d0e-5f1f0c9e2a11"
			sub, err := nc.Subscribe(compute.ReportSubject(id), func(m *nats.Msg) {
				body := []byte(`{"ok":true}`)
				if tc.code != "" {
					body, _ = json.Marshal(events.ErrorBody{Error: events.Errorf(tc.code, "answered %s", tc.code)})
				}
				_ = m.Respond(body)
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			if got := s.Send(compute.Report{SandboxID: id, Generation: 1, Kind: compute.ReportExited}); got != tc.want {
				t.Fatalf("answered %q: got %v, want %v", tc.code, got, tc.want)
			}
		})
	}
	t.Run("no gateway", func(t *testing.T) {
		if got := s.Send(compute.Report{SandboxID: "0193b0a4-7c1e-7a4e-9d0e-5f1f0c9e2a12", Generation: 1, Kind: compute.ReportExited}); got != supervisor.Again {
			t.Fatalf("nobody answered: got %v, want %v", got, supervisor.Again)
		}
	})
}

// flakyStore fails the first append of each event type in failOnce with
// ErrUnavailable (the log unreachable for a moment), appending nothing.
type flakyStore struct {
	events.Store
	mu       sync.Mutex
	failOnce map[string]bool
}

func (s *flakyStore) Append(ctx context.Context, id string, expected uint64, envs ...events.Envelope) (uint64, error) {
	s.mu.Lock()
	fail := s.failOnce[envs[0].Type]
	delete(s.failOnce, envs[0].Type)
	s.mu.Unlock()
	if fail {
		return 0, events.ErrUnavailable
	}
	return s.Store.Append(ctx, id, expected, envs...)
}

// drivers knows one driver, "sim" (the gateway's view of the compute side).
type drivers struct{}

func (drivers) Validate(string, compute.Spec) error { return nil }
func (drivers) Capabilities(string, map[string]string) (compute.Capabilities, error) {
	return compute.Capabilities{Suspend: true}, nil
}
func (drivers) Names() []string { return []string{"sim"} }
func (drivers) Logs(context.Context, string, compute.Spec, int) ([]byte, error) {
	return nil, compute.ErrUnimplemented
}
func (drivers) Dial(context.Context, string, compute.Spec, int) (net.Conn, error) {
	return nil, compute.ErrUnimplemented
}

// rig is a real gateway (its bus front, heartbeat limit limit) over a log
// on an in-process NATS server, with one sandbox created.
type rig struct {
	svc   *gateway.Service
	store events.Store
	creds *compute.Credentials
	id    string
	nc    *nats.Conn
}

func newRig(t *testing.T, limit time.Duration, failOnce ...string) *rig {
	t.Helper()
	srv := natstest.Start(t)
	ctx := context.Background()
	js, err := jsstore.New(ctx, srv.JS, jsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	names, err := gateway.NewKVNames(ctx, srv.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	creds, _ := compute.NewCredentials([]byte("0123456789abcdef0123456789abcdef"))
	store := &flakyStore{Store: js, failOnce: map[string]bool{}}
	for _, typ := range failOnce {
		store.failOnce[typ] = true
	}
	svc, err := gateway.NewService(store, names, drivers{}, creds, gateway.Config{HeartbeatLimit: limit}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	b := gateway.NewBus(srv.Conn, svc, 0, zerolog.Nop())
	bctx, cancel := context.WithCancel(ctx)
	if err := b.Listen(bctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Run(bctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		vs, err := check.Replay(ctx, js, check.Options{})
		if err != nil {
			t.Error(err)
		}
		for _, v := range vs {
			t.Errorf("the log breaks an invariant: %v", v)
		}
	})
	v, err := svc.Handle(ctx, gateway.Command{Verb: gateway.VerbCreate})
	if err != nil {
		t.Fatal(err)
	}
	// The create saga's record of the start, which a supervisor's attach
	// waits for (one writer per fact).
	envs, err := js.Load(ctx, v.ID, 0)
	if err != nil || len(envs) == 0 {
		t.Fatalf("the create: %v %v", envs, err)
	}
	if err := svc.Record(ctx, envs[0], "sagas", &events.Started{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv.Server))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return &rig{svc: svc, store: js, creds: creds, id: v.ID, nc: nc}
}

// report is a report of kind of generation gen, with its credential.
func (r *rig) report(kind string, gen int64, code int) compute.Report {
	return compute.Report{SandboxID: r.id, Generation: gen, Credential: r.creds.Mint(r.id, gen), Kind: kind, ExitCode: code}
}

// types is the sandbox's log, by event type.
func (r *rig) types(t *testing.T) []string {
	t.Helper()
	envs, err := r.store.Load(context.Background(), r.id, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = e.Type
	}
	return out
}

func (r *rig) phase(t *testing.T) events.Phase {
	t.Helper()
	sb, err := r.svc.Sandbox(context.Background(), r.id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.Phase
}

// drain runs q as a supervisor's loop does until nothing is queued.
func drain(t *testing.T, q *supervisor.Reports) {
	t.Helper()
	timeout := time.After(wait)
	for !q.Empty() {
		select {
		case <-q.C():
			q.Flush()
		case <-timeout:
			t.Fatal("reports still queued")
		}
	}
}

// TestReportsRetried: an attach and an exit each answered UNAVAILABLE once
// (an append that failed) are sent again until taken, in order, and land
// in the log once each; they were dropped on the first answer.
func TestReportsRetried(t *testing.T) {
	r := newRig(t, time.Hour, events.TypeSupervisorAttached, events.TypeExited)
	q := supervisor.NewReports(&supervisor.Sender{NC: r.nc, Log: zerolog.Nop()})
	defer q.Stop()
	q.Add(r.report(compute.ReportAttached, 1, 0))
	q.Add(r.report(compute.ReportExited, 1, 7))
	drain(t, q)
	want := []string{events.TypeCreated, events.TypeStarted, events.TypeSupervisorAttached, events.TypeExited}
	if got := r.types(t); !slices.Equal(got, want) {
		t.Fatalf("log %v, want %v", got, want)
	}
	sb, err := r.svc.Sandbox(context.Background(), r.id)
	if err != nil || sb.View.ExitCode == nil || *sb.View.ExitCode != 7 {
		t.Fatalf("after the exit: %+v, %v; want exit code 7", sb, err)
	}
}

// TestReattachAfterDetach: a supervisor silent past the heartbeat limit
// (cut off, say) is recorded detached and its sandbox goes provisioning;
// when its beats come back, refused as not attached, it attaches again
// and the sandbox is ready once more, so the provisioning deadline finds
// nothing to put in error. It was detached for good: every beat refused,
// the healthy workload put in error at the deadline. A supervisor whose
// generation is no longer current attaches again once, is refused, and
// does not try at every beat.
func TestReattachAfterDetach(t *testing.T) {
	const limit = 300 * time.Millisecond
	r := newRig(t, limit)
	ctx := context.Background()
	q := supervisor.NewReports(&supervisor.Sender{NC: r.nc, Log: zerolog.Nop()})
	defer q.Stop()
	beat := r.report(compute.ReportHeartbeat, 1, 0)
	q.Add(r.report(compute.ReportAttached, 1, 0))
	drain(t, q)
	q.Beat(beat)
	if !q.Empty() {
		t.Fatal("a beat taken queued a report")
	}
	// Silent now, as when cut off: detached within the limit and a tick.
	deadline := time.Now().Add(wait)
	for !slices.Contains(r.types(t), events.TypeSupervisorDetached) {
		if time.Now().After(deadline) {
			t.Fatal("a silent supervisor was not detached")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p := r.phase(t); p != events.PhaseProvisioning {
		t.Fatalf("detached: %s, want provisioning", p)
	}
	// The beats come back: the first is refused, and the supervisor
	// attaches again.
	q.Beat(beat)
	drain(t, q)
	want := []string{events.TypeCreated, events.TypeStarted, events.TypeSupervisorAttached, events.TypeSupervisorDetached, events.TypeSupervisorAttached}
	if got := r.types(t); !slices.Equal(got, want) {
		t.Fatalf("log %v, want %v", got, want)
	}
	if p := r.phase(t); p != events.PhaseReady {
		t.Fatalf("after the beats came back: %s, want ready", p)
	}
	// The provisioning deadline that ran from the detach is not due any
	// more: the sandbox is ready.
	err := r.svc.Record(ctx, events.Envelope{SandboxID: r.id}, "test", &events.DeadlinePassed{Phase: events.PhaseProvisioning, Deadline: "1ns"})
	if events.CodeOf(err) != events.CodeFailedPrecondition || r.phase(t) != events.PhaseReady {
		t.Fatalf("the provisioning deadline after the re-attach: %v, %s; want refused, ready", err, r.phase(t))
	}
	q.Beat(beat)
	if !q.Empty() {
		t.Fatal("a beat taken after the re-attach queued a report")
	}
	// Stopped: the generation is not attached, and its attach does not
	// fit. The supervisor tries once, then beats without attaching again.
	if _, err := r.svc.Handle(ctx, gateway.Command{Verb: gateway.VerbStop, ID: r.id}); err != nil {
		t.Fatal(err)
	}
	if err := r.svc.Record(ctx, events.Envelope{SandboxID: r.id}, "test", &events.Stopped{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	q.Beat(beat)
	if q.Empty() {
		t.Fatal("a beat refused queued no attach")
	}
	drain(t, q)
	q.Beat(beat)
	if !q.Empty() {
		t.Fatal("a beat refused after an attach refused queued another attach")
	}
	if n := r.svc.ReportsRefused(); n != 4 {
		t.Fatalf("refused reports %d, want 4 (the beat after the detach, two beats and an attach after the stop)", n)
	}
}
