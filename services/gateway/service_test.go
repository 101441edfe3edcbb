package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
)

// fakeDrivers knows one driver, "sim", that can suspend.
type fakeDrivers struct{}

func (fakeDrivers) Validate(name string, _ compute.Spec) error {
	if name != "sim" {
		return errors.New("unknown driver " + name)
	}
	return nil
}
func (fakeDrivers) Capabilities(string, map[string]string) (compute.Capabilities, error) {
	return compute.Capabilities{Suspend: true}, nil
}
func (fakeDrivers) Names() []string { return []string{"sim"} }
func (fakeDrivers) Logs(context.Context, string, compute.Spec, int) ([]byte, error) {
	return nil, compute.ErrUnimplemented
}
func (fakeDrivers) Dial(context.Context, string, compute.Spec, int) (net.Conn, error) {
	return nil, compute.ErrUnimplemented
}

type rig struct {
	store *jsstore.Store
	names *KVNames
	creds *compute.Credentials
	js    jetstream.JetStream
	srv   *natstest.Server
}

func newRig(t *testing.T) *rig {
	t.Helper()
	s := natstest.Start(t)
	ctx := context.Background()
	store, err := jsstore.New(ctx, s.JS, jsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	names, err := NewKVNames(ctx, s.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	creds, _ := compute.NewCredentials([]byte("0123456789abcdef0123456789abcdef"))
	r := &rig{store: store, names: names, creds: creds, js: s.JS, srv: s}
	t.Cleanup(func() { r.checkLog(t) }) // before the server stops (cleanups run last first)
	return r
}

// checkLog runs the invariant checker over every sandbox's log.
func (r *rig) checkLog(t *testing.T) {
	t.Helper()
	vs, err := check.Replay(context.Background(), r.store, check.Options{})
	if err != nil {
		t.Errorf("%v", err)
	}
	for _, v := range vs {
		t.Errorf("the log breaks an invariant: %v", v)
	}
}

// service is one gateway instance (its own cache and locks) over the rig's log.
func (r *rig) service(t *testing.T) *Service {
	t.Helper()
	svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// readySandbox creates a sandbox and records its supervisor's attach.
func readySandbox(t *testing.T, svc *Service) events.View {
	t.Helper()
	ctx := context.Background()
	v, err := svc.Handle(ctx, Command{Verb: VerbCreate})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.SupervisorAttached{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	sb, err := svc.Sandbox(ctx, v.ID)
	if err != nil || sb.Phase != events.PhaseReady {
		t.Fatalf("sandbox %+v, %v", sb, err)
	}
	return sb.View
}

func countTypes(t *testing.T, store events.Store, id string) map[string]int {
	t.Helper()
	envs, err := store.Load(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, e := range envs {
		m[e.Type]++
	}
	return m
}

// TestConflictingCommandsOneWins: two gateway instances (no shared lock or
// cache) race a stop and a suspend on one ready sandbox: exactly one wins, the
// other reloads, sees the new phase and is refused; nothing is lost.
func TestConflictingCommandsOneWins(t *testing.T) {
	r := newRig(t)
	a, b := r.service(t), r.service(t)
	for round := 0; round < 10; round++ {
		v := readySandbox(t, a)
		if _, err := b.Sandbox(context.Background(), v.ID); err != nil { // b caches the ready state too
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, c := range []struct {
			svc  *Service
			verb string
		}{{a, VerbStop}, {b, VerbSuspend}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = c.svc.Handle(context.Background(), Command{Verb: c.verb, ID: v.ID})
			}()
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch code := events.CodeOf(err); code {
			case "":
				won++
			case events.CodeFailedPrecondition, events.CodeAborted:
			default:
				t.Fatalf("loser got %v (%s), want FAILED_PRECONDITION or ABORTED", err, code)
			}
		}
		n := countTypes(t, r.store, v.ID)
		if won != 1 || n["sandbox.stop_requested"]+n["sandbox.suspend_requested"] != 1 {
			t.Fatalf("round %d: %d winners, log %v", round, won, n)
		}
	}
}

// TestStaleCacheRecovers: an instance whose cached state is behind the log
// still decides on the truth (the append conflicts, it reloads).
func TestStaleCacheRecovers(t *testing.T) {
	r := newRig(t)
	a, b := r.service(t), r.service(t)
	ctx := context.Background()
	v := readySandbox(t, a)
	if _, err := b.Sandbox(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Handle(ctx, Command{Verb: VerbStop, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	// b still believes the sandbox is ready; its suspend must be refused.
	_, err := b.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID})
	if code := events.CodeOf(err); code != events.CodeFailedPrecondition {
		t.Fatalf("suspend on a stale cache: %v, want FAILED_PRECONDITION", err)
	}
	// And a stop from b is the idempotent no-op it should be.
	got, err := b.Handle(ctx, Command{Verb: VerbStop, ID: v.ID})
	if err != nil || got.Phase != events.PhaseStopping {
		t.Fatalf("stop from b: %+v, %v", got, err)
	}
	if n := countTypes(t, r.store, v.ID); n["sandbox.stop_requested"] != 1 {
		t.Fatalf("log %v", n)
	}
}

// TestRetriedCommandLandsOnce: the same command (same idempotency key) sent
// many times, concurrently, through two instances, is in the log once.
func TestRetriedCommandLandsOnce(t *testing.T) {
	r := newRig(t)
	a, b := r.service(t), r.service(t)
	v := readySandbox(t, a)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		svc := a
		if i%2 == 1 {
			svc = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := svc.Handle(context.Background(), Command{Verb: VerbSuspend, ID: v.ID, IdempotencyKey: "k1"}); err != nil {
				t.Errorf("retry: %v", err)
			}
		}()
	}
	wg.Wait()
	if n := countTypes(t, r.store, v.ID); n["sandbox.suspend_requested"] != 1 {
		t.Fatalf("log %v, want one suspend_requested", n)
	}
}

// TestRecordFencesAndValidates: saga and supervisor reports go through the
// table and the generation fence; refused ones append nothing.
func TestRecordFencesAndValidates(t *testing.T) {
	r := newRig(t)
	svc := r.service(t)
	ctx := context.Background()
	v := readySandbox(t, svc)
	cases := []struct {
		name string
		e    events.Event
		code events.Code
	}{
		{"outcome the phase does not accept", &events.Suspended{Generation: 1, RestoreRef: "r"}, events.CodeFailedPrecondition},
		{"report of a future generation", &events.Exited{Generation: 2}, events.CodeFailedPrecondition},
		{"report of an old generation", &events.Exited{Generation: 0}, events.CodeFailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", c.e)
			if events.CodeOf(err) != c.code {
				t.Fatalf("record: %v, want %s", err, c.code)
			}
		})
	}
	if err := svc.Record(ctx, events.Envelope{SandboxID: "0193b0a4-0000-7000-8000-0000000000ff"}, "test", &events.Exited{}); events.CodeOf(err) != events.CodeNotFound {
		t.Fatalf("record on an unknown sandbox: %v", err)
	}
	if n := countTypes(t, r.store, v.ID); len(n) != 2 {
		t.Fatalf("refused records appended: %v", n)
	}
	// A report the phase accepts lands, stamped with the table's phase.
	if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Exited{Generation: 1, Code: 4}); err != nil {
		t.Fatal(err)
	}
	envs, _ := r.store.Load(ctx, v.ID, 0)
	if last := envs[len(envs)-1]; last.Type != "sandbox.exited" || last.Phase != events.PhaseError {
		t.Fatalf("last event %s in phase %s", last.Type, last.Phase)
	}
}

// TestNamesAreUnique: a name in use is ALREADY_EXISTS, even from another
// instance; released on delete.
func TestNamesAreUnique(t *testing.T) {
	r := newRig(t)
	a, b := r.service(t), r.service(t)
	ctx := context.Background()
	v, err := a.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "one"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "one"}}); events.CodeOf(err) != events.CodeAlreadyExists {
		t.Fatalf("second create of the name: %v, want ALREADY_EXISTS", err)
	}
	if id, err := b.Resolve(ctx, "one"); err != nil || id != v.ID {
		t.Fatalf("resolve: %s, %v", id, err)
	}
	if _, err := a.Handle(ctx, Command{Verb: VerbDelete, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	if err := a.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Deleted{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "one"}}); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
}

// loadCounter counts the loads of a real store.
type loadCounter struct {
	events.Store
	mu    sync.Mutex
	loads map[string]int
}

func (c *loadCounter) Load(ctx context.Context, id string, after uint64) ([]events.Envelope, error) {
	c.mu.Lock()
	c.loads[id]++
	c.mu.Unlock()
	return c.Store.Load(ctx, id, after)
}

// TestCreateReadsNoLog checks that a create without an idempotency key does
// not read the new sandbox's subject (its id was just minted, so it is empty),
// while a create with a key does (a retry may find its sandbox there), and
// that both land and are seen by a later command.
func TestCreateReadsNoLog(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	lc := &loadCounter{Store: r.store, loads: map[string]int{}}
	svc, err := NewService(lc, r.names, fakeDrivers{}, r.creds, Config{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := svc.Handle(ctx, Command{Verb: VerbCreate})
	if err != nil {
		t.Fatal(err)
	}
	if n := lc.loads[fresh.ID]; n != 0 {
		t.Errorf("a create without a key read its new subject %d times, want 0", n)
	}
	keyed, err := svc.Handle(ctx, Command{Verb: VerbCreate, IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	if n := lc.loads[keyed.ID]; n != 1 {
		t.Errorf("a create with a key read its subject %d times, want 1", n)
	}
	again, err := svc.Handle(ctx, Command{Verb: VerbCreate, IdempotencyKey: "k1"})
	if err != nil || again.ID != keyed.ID {
		t.Fatalf("retried create: %+v, %v; want sandbox %s", again, err, keyed.ID)
	}
	for _, id := range []string{fresh.ID, keyed.ID} {
		if got := countTypes(t, r.store, id); got["sandbox.created"] != 1 || len(got) != 1 {
			t.Errorf("sandbox %s: events %v, want one sandbox.created", id, got)
		}
		if _, err := svc.Handle(ctx, Command{Verb: VerbStop, ID: id}); events.CodeOf(err) != events.CodeFailedPrecondition {
			t.Errorf("stop of provisioning %s: %v, want FAILED_PRECONDITION (the state after create)", id, err)
		}
	}
}

// TestCachedStateIsTheLogs checks, after every command and report of a
// sandbox's life, that the state the service keeps (folded as it appended)
// equals the state a service without a cache folds from the log.
func TestCachedStateIsTheLogs(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	svc := r.service(t)
	v := readySandbox(t, svc)
	check := func(step string) {
		t.Helper()
		got, err := svc.Sandbox(ctx, v.ID)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		want, err := r.service(t).Sandbox(ctx, v.ID)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: kept state\n%+v\nthe log's\n%+v", step, got, want)
		}
		if got.Seq == 0 || got.View.Seq != got.Seq {
			t.Fatalf("%s: seq %d, view seq %d", step, got.Seq, got.View.Seq)
		}
	}
	check("ready")
	cause := func(typ string) events.Envelope {
		t.Helper()
		envs, err := r.store.Load(ctx, v.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := len(envs) - 1; i >= 0; i-- {
			if envs[i].Type == typ {
				return envs[i]
			}
		}
		t.Fatalf("no %s in the log", typ)
		return events.Envelope{}
	}
	if _, err := svc.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	check("suspend")
	if err := svc.Record(ctx, cause("sandbox.suspend_requested"), "saga", &events.Suspended{Generation: 1, RestoreRef: "ref-1"}); err != nil {
		t.Fatal(err)
	}
	check("suspended")
	if _, err := svc.Handle(ctx, Command{Verb: VerbResume, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	check("resume")
	in := cause("sandbox.resume_requested")
	if err := svc.Record(ctx, in, "saga", &events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}); err != nil {
		t.Fatal(err)
	}
	check("consumed")
	if err := svc.Record(ctx, in, "saga", &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}); err != nil {
		t.Fatal(err)
	}
	check("resumed")
	if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "supervisor:2", &events.SupervisorAttached{Generation: 2}); err != nil {
		t.Fatal(err)
	}
	check("attached")
	if _, err := svc.Handle(ctx, Command{Verb: VerbStop, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	check("stop")
}

// TestAnswersWithoutAppendAreCurrent: a command that appends nothing (an
// idempotent repeat, a refusal) meets no concurrency check, so an instance
// whose cache another instance has moved past must not answer it from that
// cache: it reads the subject's head first and decides on the log.
func TestAnswersWithoutAppendAreCurrent(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	t.Run("start on a sandbox stopped elsewhere", func(t *testing.T) {
		a, b := r.service(t), r.service(t)
		v := readySandbox(t, a) // a caches it ready
		if _, err := b.Handle(ctx, Command{Verb: VerbStop, ID: v.ID}); err != nil {
			t.Fatal(err)
		}
		if err := b.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Stopped{Generation: 1}); err != nil {
			t.Fatal(err)
		}
		got, err := a.Handle(ctx, Command{Verb: VerbStart, ID: v.ID})
		if err != nil || got.Phase != events.PhaseStarting || got.Generation != 2 {
			t.Fatalf("start through the stale instance: %+v, %v; want starting at generation 2", got, err)
		}
		if n := countTypes(t, r.store, v.ID); n[events.TypeStartRequested] != 1 {
			t.Fatalf("log %v, want one start_requested", n)
		}
	})
	t.Run("suspend on a sandbox resumed elsewhere", func(t *testing.T) {
		a, b := r.service(t), r.service(t)
		v := readySandbox(t, a)
		if _, err := a.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID}); err != nil {
			t.Fatal(err)
		}
		if err := a.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Suspended{Generation: 1, RestoreRef: "r1"}); err != nil {
			t.Fatal(err)
		}
		// b resumes it to ready; a still holds it suspended.
		if _, err := b.Handle(ctx, Command{Verb: VerbResume, ID: v.ID}); err != nil {
			t.Fatal(err)
		}
		if err := b.Record(ctx, events.Envelope{SandboxID: v.ID}, "test",
			&events.RetainedStateConsumed{Generation: 2, RestoreRef: "r1"}, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Report(ctx, v.ID, attachReport(t, r, v.ID, 2)); err != nil {
			t.Fatal(err)
		}
		got, err := a.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID})
		if err != nil || got.Phase != events.PhaseSuspending || got.Generation != 2 {
			t.Fatalf("suspend through the stale instance: %+v, %v; want suspending at generation 2", got, err)
		}
	})
	t.Run("a refusal", func(t *testing.T) {
		a, b := r.service(t), r.service(t)
		v := readySandbox(t, a)
		if _, err := a.Handle(ctx, Command{Verb: VerbStop, ID: v.ID}); err != nil {
			t.Fatal(err)
		}
		if err := b.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.StopRejected{Generation: 1}); err != nil {
			t.Fatal(err)
		}
		// a holds it stopping, where suspend is refused; it is ready.
		got, err := a.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID})
		if err != nil || got.Phase != events.PhaseSuspending {
			t.Fatalf("suspend through the stale instance: %+v, %v; want suspending", got, err)
		}
	})
}

// attachReport is the JSON of a supervisor's attach of generation gen.
func attachReport(t *testing.T, r *rig, id string, gen int64) []byte {
	t.Helper()
	data, err := json.Marshal(compute.Report{SandboxID: id, Generation: gen, Credential: r.creds.Mint(id, gen), Kind: compute.ReportAttached})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestForeignBytesOnTheSubject: a message that is not a torpor event on a
// sandbox's subject is skipped by the aggregate, the history and a point
// in time view, and the sandbox takes commands after it. A well-formed
// envelope that the aggregate cannot take is in the history (it is an
// envelope) but passed over by the aggregate and counted.
func TestForeignBytesOnTheSubject(t *testing.T) {
	r := newRig(t)
	svc := r.service(t)
	ctx := context.Background()
	v := readySandbox(t, svc)
	for _, body := range []string{"not json", `{"id":"x","type":"sandbox.suspended","sandbox_id":"` + v.ID + `","schema":1,"data":{}}`} {
		if _, err := r.js.Publish(ctx, jsstore.Subject(v.ID), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	// Two well-formed envelopes no gateway would write: data that does not
	// fit its type, and an event the table refuses in ready.
	head, err := r.store.Head(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	misfit := events.Envelope{ID: "misfit", SandboxID: v.ID, Type: events.TypeSuspended, Schema: 1, Time: time.Now(), Data: []byte(`{"generation":"one"}`)}
	refused := events.Envelope{ID: "refused", SandboxID: v.ID, Type: events.TypeDeleted, Schema: 1, Time: time.Now(), Data: []byte(`{}`)}
	if head, err = r.store.Append(ctx, v.ID, head, misfit); err != nil {
		t.Fatal(err)
	}
	if _, err = r.store.Append(ctx, v.ID, head, refused); err != nil {
		t.Fatal(err)
	}
	got, err := svc.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID})
	if err != nil || got.Phase != events.PhaseSuspending {
		t.Fatalf("suspend after foreign bytes: %+v, %v", got, err)
	}
	envs, err := svc.History(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range envs {
		types = append(types, e.Type)
	}
	if n := svc.PassedOver(); n != 2 {
		t.Errorf("passed over %d stored events, want the misfit and the refused one", n)
	}
	want := []string{events.TypeCreated, events.TypeSupervisorAttached, events.TypeSuspended, events.TypeDeleted, events.TypeSuspendRequested}
	if !reflect.DeepEqual(types, want) {
		t.Fatalf("history %v, want %v", types, want)
	}
	at, err := svc.ViewAt(ctx, v.ID, envs[1].Seq, time.Time{})
	if err != nil || at.Phase != events.PhaseReady {
		t.Fatalf("view just before the suspend: %+v, %v; want ready", at, err)
	}
	// A fresh instance folds the same log.
	if sb, err := r.service(t).Sandbox(ctx, v.ID); err != nil || sb.Phase != events.PhaseSuspending {
		t.Fatalf("fresh instance: %+v, %v", sb, err)
	}
}

// TestLostReservationIsReclaimed: a create reserves its name, then appends;
// one that died between the two left a reservation whose sandbox has no
// events. Within the name grace the name is still taken (that create may be
// under way); past it a create of the name takes it over. A name whose
// sandbox exists is never taken, however old.
func TestLostReservationIsReclaimed(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	lost := "0193b0a4-0000-7000-8000-00000000dead"
	if _, err := r.names.Reserve(ctx, "lost", lost); err != nil {
		t.Fatal(err)
	}
	now := r.service(t)
	if _, err := now.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "lost"}}); events.CodeOf(err) != events.CodeAlreadyExists {
		t.Fatalf("create within the grace: %v, want ALREADY_EXISTS", err)
	}
	live, err := now.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "live"}})
	if err != nil {
		t.Fatal(err)
	}
	later := r.service(t)
	later.now = func() time.Time { return time.Now().Add(2 * later.cfg.NameGrace) }
	v, err := later.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "lost"}})
	if err != nil {
		t.Fatalf("create past the grace: %v", err)
	}
	if id, err := later.Resolve(ctx, "lost"); err != nil || id != v.ID {
		t.Fatalf("the name resolves to %s, %v; want the new sandbox %s", id, err, v.ID)
	}
	if _, err := later.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "live"}}); events.CodeOf(err) != events.CodeAlreadyExists {
		t.Fatalf("create of a live sandbox's name past the grace: %v, want ALREADY_EXISTS", err)
	}
	if id, _ := later.Resolve(ctx, "live"); id != live.ID {
		t.Fatalf("the live name moved to %s", id)
	}
}

// TestEarlyAttachWaitsForTheSaga: one writer per fact. The resumed
// generation's supervisor attaches before the resume saga recorded the
// consumption and the restore: the gateway records neither for it. Past
// the report hold it answers ABORTED (the supervisor asks again) and
// appends nothing; an attach that is waiting when the saga's record lands
// through another instance is taken after it. The log reads the
// consumption and the restore once each, the saga's, then the attach, the
// supervisor's. The attach recorded both itself, as supervisor:2, and the
// saga's copies were dropped.
func TestEarlyAttachWaitsForTheSaga(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	instance := func(hold time.Duration) *Service {
		svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{ReportHold: hold}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	saga, brief, patient := instance(0), instance(time.Millisecond), instance(time.Minute)
	v := readySandbox(t, saga)
	command(VerbSuspend)(t, saga, v.ID)
	if err := saga.Record(ctx, events.Envelope{SandboxID: v.ID}, "sagas", &events.Suspended{Generation: 1, RestoreRef: "ref-1"}); err != nil {
		t.Fatal(err)
	}
	command(VerbResume)(t, saga, v.ID)
	before := countTypes(t, r.store, v.ID)
	if _, err := brief.Report(ctx, v.ID, attachReport(t, r, v.ID, 2)); events.CodeOf(err) != events.CodeAborted {
		t.Fatalf("an attach before the saga's record, past the hold: %v, want ABORTED", err)
	}
	if got := countTypes(t, r.store, v.ID); !reflect.DeepEqual(got, before) {
		t.Fatalf("the early attach appended: %v, was %v", got, before)
	}
	taken := make(chan error, 1)
	go func() {
		_, err := patient.Report(ctx, v.ID, attachReport(t, r, v.ID, 2))
		taken <- err
	}()
	var request events.Envelope
	envs, err := r.store.Load(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range envs {
		if e.Type == events.TypeResumeRequested {
			request = e
		}
	}
	if err := saga.Record(ctx, request, "sagas", &events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}); err != nil {
		t.Fatal(err)
	}
	if err := saga.Record(ctx, request, "sagas", &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}); err != nil {
		t.Fatal(err)
	}
	if err := <-taken; err != nil {
		t.Fatalf("the attach waiting for the saga's record: %v", err)
	}
	envs, err = r.store.Load(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range envs[len(envs)-3:] {
		got = append(got, e.Type+" by "+e.Actor)
	}
	want := []string{events.TypeRetainedStateConsumed + " by sagas", events.TypeResumed + " by sagas", events.TypeSupervisorAttached + " by supervisor:2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the log ends %v, want %v", got, want)
	}
	n := countTypes(t, r.store, v.ID)
	if n[events.TypeRetainedStateConsumed] != 1 || n[events.TypeResumed] != 1 {
		t.Fatalf("log %v: want the consumption and the restore once", n)
	}
	if sb, err := instance(0).Sandbox(ctx, v.ID); err != nil || sb.Phase != events.PhaseReady || sb.Attached != 2 || sb.RestoreRef != "" {
		t.Fatalf("after the attach: %+v, %v; want ready, generation 2 attached, nothing held", sb, err)
	}
}

// TestEarlyExitWaitsForTheStart: a workload that exits at once is
// reported exited by its supervisor before the create saga recorded
// sandbox.started: the exit is not taken before the saga's record (past
// the hold, ABORTED: its supervisor sends it again) and is taken after
// it, its code kept. The exit moved the sandbox to error first, and the
// saga's started was refused there and dropped.
func TestEarlyExitWaitsForTheStart(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	saga := r.service(t)
	brief, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{ReportHold: time.Millisecond}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	v, err := saga.Handle(ctx, Command{Verb: VerbCreate})
	if err != nil {
		t.Fatal(err)
	}
	exit, _ := json.Marshal(compute.Report{SandboxID: v.ID, Generation: 1, Credential: r.creds.Mint(v.ID, 1), Kind: compute.ReportExited, ExitCode: 7})
	if _, err := brief.Report(ctx, v.ID, exit); events.CodeOf(err) != events.CodeAborted {
		t.Fatalf("an exit before the saga's started, past the hold: %v, want ABORTED", err)
	}
	envs, err := r.store.Load(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := saga.Record(ctx, envs[0], "sagas", &events.Started{Generation: 1}); err != nil {
		t.Fatalf("the create saga's started: %v", err)
	}
	if _, err := brief.Report(ctx, v.ID, exit); err != nil {
		t.Fatalf("the exit sent again: %v", err)
	}
	envs, err = r.store.Load(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range envs {
		got = append(got, e.Type)
	}
	if want := []string{events.TypeCreated, events.TypeStarted, events.TypeExited}; !reflect.DeepEqual(got, want) {
		t.Fatalf("log %v, want %v", got, want)
	}
	if sb, err := r.service(t).Sandbox(ctx, v.ID); err != nil || sb.Phase != events.PhaseError || sb.View.ExitCode == nil || *sb.View.ExitCode != 7 {
		t.Fatalf("after the exit: %+v, %v; want error, exit code 7", sb, err)
	}
}

// TestNameEntryTrustedOnlyIfTheLogAgrees (issue 23, attack 8): torpor_names
// is on the bus. An entry pointing a name at another sandbox, or at
// nothing, resolves to NOT_FOUND, so `delete c1` can never delete c2.
func TestNameEntryTrustedOnlyIfTheLogAgrees(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	svc := r.service(t)
	c1, err := svc.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "c1"}})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := svc.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Name: "c2"}})
	if err != nil {
		t.Fatal(err)
	}
	if id, err := svc.Resolve(ctx, "c1"); err != nil || id != c1.ID {
		t.Fatalf("c1 resolves to %s, %v; want %s", id, err, c1.ID)
	}
	kv, err := r.js.KeyValue(ctx, "torpor_names")
	if err != nil {
		t.Fatal(err)
	}
	for value, why := range map[string]string{
		c2.ID:                                  "another sandbox's id",
		"0193b0a4-0000-7000-8000-00000000beef": "a sandbox that does not exist",
		"not an id":                            "not a sandbox id",
	} {
		if _, err := kv.Put(ctx, "c1", []byte(value)); err != nil {
			t.Fatal(err)
		}
		if id, err := svc.Resolve(ctx, "c1"); events.CodeOf(err) != events.CodeNotFound {
			t.Errorf("c1 pointed at %s resolves to %q, %v; want NOT_FOUND", why, id, err)
		}
	}
	if id, err := svc.Resolve(ctx, "c2"); err != nil || id != c2.ID {
		t.Errorf("c2 resolves to %s, %v; want %s", id, err, c2.ID)
	}
}
