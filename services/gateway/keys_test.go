package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
)

// window is the bus's deduplication window of the rig keyRig builds: short,
// so that a retry can come after it.
const window = 100 * time.Millisecond

// keyRig is newRig with a deduplication window of window.
func keyRig(t *testing.T) *rig {
	t.Helper()
	s := natstest.Start(t)
	ctx := context.Background()
	store, err := jsstore.New(ctx, s.JS, jsstore.Config{DuplicateWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	names, err := NewKVNames(ctx, s.JS, 1)
	if err != nil {
		t.Fatal(err)
	}
	creds, _ := compute.NewCredentials([]byte("0123456789abcdef0123456789abcdef"))
	r := &rig{store: store, names: names, creds: creds, js: s.JS, srv: s}
	t.Cleanup(func() { r.checkLog(t) })
	return r
}

// clocked is a service of r whose clock is *now.
func clocked(t *testing.T, r *rig, now *time.Time) *Service {
	t.Helper()
	svc, err := NewService(r.store, r.names, fakeDrivers{}, r.creds, Config{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	svc.now = func() time.Time { return *now }
	return svc
}

func seqOf(t *testing.T, store events.Store, id string) uint64 {
	t.Helper()
	seq, err := store.Head(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// same fails t unless got is want, the answer a command gave first.
func same(t *testing.T, what string, got events.View, err error, want events.View) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v; want the first answer", what, err)
	}
	got.UpdatedAt, want.UpdatedAt = got.UpdatedAt.UTC(), want.UpdatedAt.UTC()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Fatalf("%s answered\n%s\nwant the first answer\n%s", what, g, w)
	}
}

// TestKeyHoldsPastManyCommands: a keyed create and a keyed stop, then 41
// keyed commands (and their outcomes) and the bus's deduplication window;
// the stop retried with its key answers what it answered first and appends
// nothing, through the same instance and through one started afresh (its
// state folded from the log), and so does the create. It failed with the
// 32 command ids a sandbox used to remember: the retry stopped the sandbox
// again, and a retried create answered the sandbox as it is now.
func TestKeyHoldsPastManyCommands(t *testing.T) {
	r := keyRig(t)
	ctx := context.Background()
	svc := r.service(t)
	start := time.Now()
	created, err := svc.Handle(ctx, Command{Verb: VerbCreate, IdempotencyKey: "c0"})
	if err != nil {
		t.Fatal(err)
	}
	v := created
	if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.SupervisorAttached{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	first, err := svc.Handle(ctx, Command{Verb: VerbStop, ID: v.ID, IdempotencyKey: "k0"})
	if err != nil || first.Phase != events.PhaseStopping {
		t.Fatalf("stop: %+v, %v", first, err)
	}
	for i := 1; i <= 41; i++ { // odd: a start, even: a stop; the last a start
		gen := first.Generation + int64(i/2)
		var cmd Command
		var outcome events.Event
		if i%2 == 1 {
			// the stop before stopped: stopped; start it again
			if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Stopped{Generation: gen}); err != nil {
				t.Fatal(err)
			}
			cmd, outcome = Command{Verb: VerbStart, ID: v.ID}, &events.SupervisorAttached{Generation: gen + 1}
		} else {
			cmd, outcome = Command{Verb: VerbStop, ID: v.ID}, nil
		}
		cmd.IdempotencyKey = fmt.Sprintf("k%d", i)
		if _, err := svc.Handle(ctx, cmd); err != nil {
			t.Fatalf("command %d (%s): %v", i, cmd.Verb, err)
		}
		if outcome != nil {
			if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", outcome); err != nil {
				t.Fatal(err)
			}
		}
	}
	if d := window - time.Since(start); d > 0 {
		time.Sleep(d + 10*time.Millisecond) // past the bus's deduplication window
	}
	head := seqOf(t, r.store, v.ID)
	if sb, _ := svc.Sandbox(ctx, v.ID); sb.Phase != events.PhaseReady {
		t.Fatalf("after 40 commands the sandbox is %s, want ready", sb.Phase)
	}
	got, err := svc.Handle(ctx, Command{Verb: VerbStop, ID: v.ID, IdempotencyKey: "k0"})
	same(t, "the stop retried", got, err, first)
	if h := seqOf(t, r.store, v.ID); h != head {
		t.Fatalf("the retry moved the log from seq %d to %d", head, h)
	}
	fresh := r.service(t)
	got, err = fresh.Handle(ctx, Command{Verb: VerbStop, ID: v.ID, IdempotencyKey: "k0"})
	same(t, "the stop retried through an instance started afresh", got, err, first)
	got, err = fresh.Handle(ctx, Command{Verb: VerbCreate, IdempotencyKey: "c0"})
	same(t, "the create retried", got, err, created)
	if h := seqOf(t, r.store, v.ID); h != head {
		t.Fatalf("the retry moved the log from seq %d to %d", head, h)
	}
}

// TestKeyHoldsADay: with a clock the test moves, a keyed command on a
// sandbox retried 25 hours later (past KeyTTL) still answers what it first
// answered and appends nothing; a create's key is kept in KV for KeyTTL.
func TestKeyHoldsADay(t *testing.T) {
	r := keyRig(t)
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	svc := clocked(t, r, &now)
	v := readySandbox(t, svc)
	first, err := svc.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID, IdempotencyKey: "day"})
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute)
	if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.SuspendRejected{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	head := seqOf(t, r.store, v.ID)
	for _, after := range []time.Duration{KeyTTL - time.Minute, KeyTTL + time.Hour} {
		now = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC).Add(after)
		got, err := clocked(t, r, &now).Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID, IdempotencyKey: "day"})
		same(t, "the suspend retried "+after.String()+" later", got, err, first)
		if h := seqOf(t, r.store, v.ID); h != head {
			t.Fatalf("the retry %s later moved the log from seq %d to %d", after, head, h)
		}
	}
	st, err := r.names.keys.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != KeyTTL {
		t.Fatalf("create keys kept %s, want KeyTTL %s", st.TTL(), KeyTTL)
	}
}

// suspendedSandbox is a ready sandbox suspended on reference r1.
func suspendedSandbox(t *testing.T, svc *Service) events.View {
	t.Helper()
	ctx := context.Background()
	v := readySandbox(t, svc)
	if _, err := svc.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Suspended{Generation: 1, RestoreRef: "r1"}); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestStartDuringResumeIsNotLost: a start while a resume is under way used
// to answer OK and append nothing; the resume then failed back to suspended
// and the start never happened. It is ABORTED (retry once it settles), and
// the retry after the failed resume starts the sandbox cold.
func TestStartDuringResumeIsNotLost(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	svc := r.service(t)
	v := suspendedSandbox(t, svc)
	if _, err := svc.Handle(ctx, Command{Verb: VerbResume, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	_, err := svc.Handle(ctx, Command{Verb: VerbStart, ID: v.ID, IdempotencyKey: "s"})
	if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.ResumeFailed{Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if n := countTypes(t, r.store, v.ID)[events.TypeStartRequested]; err == nil && n == 0 {
		t.Fatalf("the start during the resume answered OK; the resume failed and no start happened")
	}
	if code := events.CodeOf(err); code != events.CodeAborted {
		t.Fatalf("start during the resume: %v (code %q); want ABORTED", err, code)
	}
	got, err := svc.Handle(ctx, Command{Verb: VerbStart, ID: v.ID, IdempotencyKey: "s"})
	if err != nil || got.Phase != events.PhaseStarting || got.Generation != 3 {
		t.Fatalf("start retried after the failed resume: %+v, %v; want starting at generation 3", got, err)
	}
	if n := countTypes(t, r.store, v.ID)[events.TypeStartRequested]; n != 1 {
		t.Fatalf("start_requested %d times, want once", n)
	}
}

// TestTwinJoinsTheOneInFlight: a suspend on suspending, a stop on stopping,
// a resume on starting after a resume and a delete on deleting append
// nothing and answer the id of the command in flight, whose outcome is
// theirs; it used to answer a bare OK, and when the twin was rejected the
// caller had no way to tell. A command's own retry names no twin.
func TestTwinJoinsTheOneInFlight(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	svc := r.service(t)
	twin := func(t *testing.T, verb, id string) {
		t.Helper()
		if _, err := svc.Handle(ctx, Command{Verb: verb, ID: id, IdempotencyKey: "first"}); err != nil {
			t.Fatal(err)
		}
		head := seqOf(t, r.store, id)
		got, err := svc.Handle(ctx, Command{Verb: verb, ID: id, IdempotencyKey: "second"})
		if err != nil || got.Joined != CommandID(verb, id, "first") {
			t.Fatalf("%s twin: joined %q, %v; want %q", verb, got.Joined, err, CommandID(verb, id, "first"))
		}
		again, err := svc.Handle(ctx, Command{Verb: verb, ID: id, IdempotencyKey: "first"})
		if err != nil || again.Joined != "" {
			t.Fatalf("%s retried: joined %q, %v; want none", verb, again.Joined, err)
		}
		if h := seqOf(t, r.store, id); h != head {
			t.Fatalf("%s twin moved the log from seq %d to %d", verb, head, h)
		}
	}
	t.Run("suspend", func(t *testing.T) {
		v := readySandbox(t, svc)
		twin(t, VerbSuspend, v.ID)
		if err := svc.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.SuspendRejected{Generation: 1}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("stop", func(t *testing.T) {
		v := readySandbox(t, svc)
		twin(t, VerbStop, v.ID)
	})
	t.Run("resume", func(t *testing.T) {
		v := suspendedSandbox(t, svc)
		twin(t, VerbResume, v.ID)
	})
	t.Run("delete", func(t *testing.T) {
		v := readySandbox(t, svc)
		twin(t, VerbDelete, v.ID)
	})
}

// fakeForwards binds nothing and records which forwards it serves.
type fakeForwards struct {
	mu     sync.Mutex
	served map[string]bool
}

func (f *fakeForwards) Bind(_ context.Context, _, _, _ string, _ int, _ bool) (string, error) {
	return "127.0.0.1:7", nil
}
func (f *fakeForwards) Serve(fid string) { f.mu.Lock(); f.served[fid] = true; f.mu.Unlock() }
func (f *fakeForwards) Close(fid string) { f.mu.Lock(); delete(f.served, fid); f.mu.Unlock() }
func (f *fakeForwards) serving(fid string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.served[fid]
}

// TestForwardRetriedAfterItClosed: a keyed forward, closed, then retried
// with its key: the retry answers the first answer (201, the forward) and
// leaves no listener serving a forward the log says is closed. It used to
// answer ABORTED "retry" for ever: the retry was a no-op and the view
// current.
func TestForwardRetriedAfterItClosed(t *testing.T) {
	r := newRig(t)
	svc := r.service(t)
	fw := &fakeForwards{served: map[string]bool{}}
	h := NewHTTP(svc, blockingViews{}, nil, zerolog.Nop()).WithForwards(fw)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	v := readySandbox(t, svc)
	open := func() (int, events.Forward) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/sandboxes/"+v.ID+"/forwards", strings.NewReader(`{"port":80}`))
		req.Header.Set("Idempotency-Key", "fw")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var f events.Forward
		_ = json.NewDecoder(resp.Body).Decode(&f)
		return resp.StatusCode, f
	}
	code, first := open()
	if code != http.StatusCreated || !fw.serving(first.ID) {
		t.Fatalf("forward: %d %+v, serving %v", code, first, fw.serving(first.ID))
	}
	if code, _ := do(t, http.MethodDelete, srv.URL+"/v1/sandboxes/"+v.ID+"/forwards/"+first.ID, ""); code != http.StatusAccepted {
		t.Fatalf("unforward: %d", code)
	}
	code, again := open()
	if code != http.StatusCreated || again != first {
		t.Fatalf("forward retried: %d %+v; want 201 %+v", code, again, first)
	}
	if fw.serving(first.ID) {
		t.Fatal("the retry serves a forward the log says is closed")
	}
}
