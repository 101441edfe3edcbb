package sagas_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/supervisor"
	"github.com/torpor/torpor/services/gateway"
)

// eager is a driver whose workloads' supervisors attach before the driver
// answers: Start and Resume start a supervisor that sends its attach on the
// bus (asking again while the answer is not final, as every supervisor
// does) and answer only once that attach got its first answer from a
// gateway, whatever it was. It retains states behind "ref-<generation>".
type eager struct {
	nc   *nats.Conn
	quit chan struct{} // closed: the supervisors stop
	wg   sync.WaitGroup
}

// supervise starts generation gen's supervisor and waits for the first
// answer to its attach.
func (d *eager) supervise(ctx context.Context, id string, gen int64, cred string) error {
	first := make(chan struct{})
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		s := &supervisor.Sender{NC: d.nc, Log: zerolog.Nop()}
		r := compute.Report{SandboxID: id, Generation: gen, Credential: cred, Kind: compute.ReportAttached}
		for a, once := s.Send(r), false; ; a = s.Send(r) {
			if !once {
				close(first)
				once = true
			}
			if a != supervisor.Again || !pause(d.quit, supervisor.BackoffMin) {
				return
			}
		}
	}()
	select {
	case <-first:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pause waits d, false if quit closed first.
func pause(quit <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-quit:
		return false
	}
}

func (d *eager) Capabilities(map[string]string) compute.Capabilities {
	return compute.Capabilities{Suspend: true}
}

func (d *eager) Start(ctx context.Context, req compute.Start) error {
	return d.supervise(ctx, req.Spec.SandboxID, req.Generation, req.Credential)
}

func (d *eager) Stop(context.Context, compute.Target) error          { return nil }
func (d *eager) Delete(context.Context, compute.Spec) error          { return nil }
func (d *eager) Discard(context.Context, compute.Spec, string) error { return nil }

func (d *eager) Suspend(_ context.Context, t compute.Target) (string, error) {
	return fmt.Sprintf("ref-%d", t.Generation), nil
}

func (d *eager) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	if err := d.supervise(ctx, req.Spec.SandboxID, req.Generation, req.Credential); err != nil {
		return compute.ResumeResult{}, err
	}
	return compute.ResumeResult{Consumed: true}, nil
}

// TestOneWriterPerFact (issue 24, hole 13): the supervisor of a created
// and of a resumed generation attaches before the driver has answered the
// saga (over a real NATS: the gateway's bus takes the reports). Each fact
// has one writer: sandbox.started, the consumption and the restore are
// the saga's, as the driver answered, and the attach is the supervisor's,
// taken after the saga's record (the gateway holds it, then the supervisor
// asks again), never lost. The log holds each fact once, in the order of
// CONTRACT §3, and the sandbox is ready. The attach wrote the consumption
// and the restore itself (as supervisor:2) and the saga's copies were
// dropped; at the create, started came after the attach, in ready.
func TestOneWriterPerFact(t *testing.T) {
	lr := newLogRig(t)
	ctx, store, srv := context.Background(), lr.store, lr.srv
	svc, err := gateway.NewService(store, lr.names, gatewayDrivers{}, lr.creds, gateway.Config{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	bctx, stopBus := context.WithCancel(ctx)
	bus := gateway.NewBus(srv.Connect(t), svc, 0, zerolog.Nop())
	if err := bus.Listen(bctx); err != nil {
		t.Fatal(err)
	}
	busDone := make(chan error, 1)
	go func() { busDone <- bus.Run(bctx) }()
	t.Cleanup(func() { stopBus(); <-busDone })
	drv := &eager{nc: srv.Connect(t), quit: make(chan struct{})}
	t.Cleanup(func() { close(drv.quit); drv.wg.Wait() })
	r, err := sagas.New(store, &memPosition{}, svc, compute.Registry{"sim": drv}, lr.creds,
		sagas.Config{Node: "local", CheckpointEvery: time.Millisecond}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, r)

	v, err := svc.Handle(ctx, gateway.Command{Verb: gateway.VerbCreate})
	if err != nil {
		t.Fatal(err)
	}
	// log is the sandbox's log as "type by actor", once it holds every
	// one of want (an entry that starts so).
	log := func(want ...string) []string {
		t.Helper()
		deadline := time.Now().Add(wait)
		for {
			envs, err := store.Load(ctx, v.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, e := range envs {
				out = append(out, e.Type+" by "+e.Actor)
			}
			missing := slices.DeleteFunc(slices.Clone(want), func(w string) bool {
				return slices.ContainsFunc(out, func(o string) bool { return strings.HasPrefix(o, w) })
			})
			if len(missing) == 0 {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %q in %s: log %q", missing, wait, out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	created := []string{events.TypeCreated + " by ", events.TypeStarted + " by sagas", events.TypeSupervisorAttached + " by supervisor:1"}
	got := log(created[1:]...)
	if !slices.Equal(got, created) {
		t.Errorf("after the create the log reads %q, want %q", got, created)
	}
	if _, err := svc.Handle(ctx, gateway.Command{Verb: gateway.VerbSuspend, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	log(events.TypeSuspended + " by sagas")
	if _, err := svc.Handle(ctx, gateway.Command{Verb: gateway.VerbResume, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	resumed := append(slices.Clone(got[:3]),
		events.TypeSuspendRequested+" by ", events.TypeSuspended+" by sagas",
		events.TypeResumeRequested+" by ", events.TypeRetainedStateConsumed+" by sagas",
		events.TypeResumed+" by sagas", events.TypeSupervisorAttached+" by supervisor:2")
	if got := log(events.TypeSupervisorAttached+" by supervisor:2", events.TypeResumed); !slices.Equal(got, resumed) {
		t.Errorf("after the resume the log reads %q, want %q", got, resumed)
	}
	sb, err := svc.Sandbox(ctx, v.ID)
	if err != nil || sb.Phase != events.PhaseReady || sb.Attached != 2 || sb.RestoreRef != "" || sb.View.LastOutcome != events.OutcomeRestored {
		t.Fatalf("after the resume: %+v, %v; want ready, generation 2 attached, restored, nothing held", sb, err)
	}
}

// TestLostAnswerHeldAttach (issue 24, hole 13): the driver's answers come
// after the deadline (the sim's answer_delay=1s under a 300 ms deadline)
// while each generation's supervisor attaches at once. The attach waits
// at the gateway for the saga's record, which never comes: the deadline
// finds the workload running, records what the driver's answer would have
// said (started; the consumption and the restore), as the saga, and gives
// the held attach the grace; the sandbox is ready, restored, each fact
// written once by its one writer. Without the grace the healthy sandbox
// went to error; before the attach waited, it wrote the restore itself.
func TestLostAnswerHeldAttach(t *testing.T) {
	s := newStack(t, 300*time.Millisecond)
	v := s.suspended(map[string]string{"answer_delay": "1s"})
	acc, err := s.do(gateway.Command{Verb: gateway.VerbResume, ID: v.ID})
	if err != nil {
		t.Fatal(err)
	}
	got := s.await(v.ID, acc.Seq, events.PhaseStarting)
	if got.Phase != events.PhaseReady || got.Generation != 2 || got.LastOutcome != events.OutcomeRestored || got.Restore.Held {
		t.Fatalf("after the resume: %+v; want ready, generation 2, restored, nothing held", got)
	}
	envs, err := s.store.Load(context.Background(), v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	writers := map[string][]string{}
	for _, e := range envs {
		writers[e.Type] = append(writers[e.Type], e.Actor)
	}
	for typ, want := range map[string][]string{
		events.TypeStarted:               {"sagas"},
		events.TypeRetainedStateConsumed: {"sagas"},
		events.TypeResumed:               {"sagas"},
		events.TypeSupervisorAttached:    {"supervisor:1", "supervisor:2"},
	} {
		if !slices.Equal(writers[typ], want) {
			t.Errorf("%s written by %q, want %q", typ, writers[typ], want)
		}
	}
}
