package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// samples has one event of every registered type with every field set, so
// the golden files show the whole wire form.
var samples = []Event{
	&Created{Name: "web", Driver: "sim", Node: "local", DriverOptions: map[string]string{"latency": "5ms"}, Command: []string{"sleep", "1"}, Env: map[string]string{"A": "1"}, Labels: map[string]string{"team": "a"}, Generation: 1, EnvSealed: "c2VhbGVk", Idle: IdlePolicy{After: "5m0s", Action: IdleSuspend, Fallback: IdleFallbackStop}},
	&DeleteRequested{},
	&Deleted{},
	&StartRequested{Generation: 2, Fallback: true},
	&Started{Generation: 2, CredentialHash: "ab12"},
	&StartFailed{Generation: 2, Message: "no capacity"},
	&StopRequested{Generation: 2},
	&Stopped{Generation: 2, Reason: ReasonRetainedStateLost},
	&StopRejected{Generation: 2, Message: "busy"},
	&SuspendRequested{Generation: 1},
	&Suspended{Generation: 1, RestoreRef: "sim:x:1:abc"},
	&SuspendRejected{Generation: 1, Reason: ReasonDeadlineExceeded, Message: "hung"},
	&ResumeRequested{Generation: 2, RestoreRef: "sim:x:1:abc", RestartIfRestoreFails: true},
	&RetainedStateConsumed{Generation: 2, RestoreRef: "sim:x:1:abc"},
	&RetainedStateDiscarded{RestoreRef: "sim:x:1:abc"},
	&RetainedStateInvalidated{RestoreRef: "sim:x:1:abc", Reason: ReasonExpired},
	&ResumeFailed{Generation: 2, Message: "restore failed"},
	&Resumed{Generation: 2, Outcome: OutcomeRestored},
	&Exited{Generation: 2, Code: 137},
	&ResourceLost{Generation: 2, Message: "node gone"},
	&DeadlinePassed{Phase: PhaseSuspending, Deadline: "2m0s"},
	&CleanupRequested{Generation: 2, Action: CleanupStop},
	&CleanedUp{Generation: 2, Action: CleanupStop},
	&SupervisorAttached{Generation: 2},
	&SupervisorDetached{Generation: 2},
	&ForwardOpened{ForwardID: "0193b0a4-0000-7000-8000-0000000000f1", Listen: "127.0.0.1:0", Address: "127.0.0.1:43117", Port: 8000},
	&ForwardClosed{ForwardID: "0193b0a4-0000-7000-8000-0000000000f1"},
	&Expired{Policy: ExpiryRetention, ExpiresAt: time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC), Action: OnExpiryStop, RestoreRef: "sim:x:1:abc"},
	&Active{Source: ActiveForward, At: time.Date(2026, 11, 30, 10, 1, 58, 250_000_000, time.UTC)},
	&IdleTimeout{Policy: IdlePolicy{After: "5m0s", Action: IdleSuspend, Fallback: IdleFallbackStop}, LastActiveAt: time.Date(2026, 11, 30, 9, 55, 0, 0, time.UTC), Action: IdleStop},
	&RetainedStateExported{RestoreRef: "vm:n1:x:s1:abc", Via: "vmobj:x-1:abc", Bytes: 134217728},
}

// TestGoldenWireFormat guards the JSON of every event type in its envelope.
// A change here is a change of the external contract: fields may only be
// added (run `go test ./events -update` and review the diff).
func TestGoldenWireFormat(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range samples {
		seen[e.Type()] = true
		env, err := NewEnvelope("0193b0a4-0000-7000-8000-000000000001", e, Meta{Actor: "http:127.0.0.1", CommandID: "c1", CorrelationID: "c1", CausationID: "e0"}, time.Date(2026, 11, 30, 10, 2, 0, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		env.ID = "0193b0a4-0000-7000-8000-0000000000e1"
		env.Phase = PhaseReady
		got, err := json.MarshalIndent(env, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, '\n')
		path := filepath.Join("testdata", e.Type()+".json")
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v (run go test ./events -update)", e.Type(), err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s wire format changed:\n got %s\nwant %s", e.Type(), got, want)
		}
		// And it decodes back to the same event.
		var back Envelope
		if err := json.Unmarshal(want, &back); err != nil {
			t.Fatal(err)
		}
		dec, err := back.Decode()
		if err != nil {
			t.Fatalf("%s: %v", e.Type(), err)
		}
		if fmt.Sprint(dec) != fmt.Sprint(e) {
			t.Errorf("%s round trip: %v, want %v", e.Type(), dec, e)
		}
	}
	for _, typ := range Types() {
		if !seen[typ] {
			t.Errorf("registered type %s has no golden sample", typ)
		}
	}
}

// TestContractTypesRegistered: every event type CONTRACT §3 names is known.
func TestContractTypesRegistered(t *testing.T) {
	for _, typ := range []string{"sandbox.created", "sandbox.start_requested", "sandbox.started", "sandbox.stop_requested",
		"sandbox.stopped", "sandbox.stop_rejected", "sandbox.suspend_requested", "sandbox.suspended", "sandbox.suspend_rejected",
		"sandbox.resume_requested", "sandbox.retained_state_consumed", "sandbox.retained_state_discarded",
		"sandbox.retained_state_invalidated", "sandbox.resume_failed", "sandbox.resumed", "sandbox.exited",
		"sandbox.resource_lost", "sandbox.deadline_passed", "sandbox.delete_requested", "sandbox.deleted",
		"supervisor.attached", "supervisor.detached"} {
		if !Known(typ) {
			t.Errorf("%s is not registered", typ)
		}
	}
}

func TestDecodeUnknownAndMalformed(t *testing.T) {
	if _, err := Decode("sandbox.from_the_future", []byte(`{}`)); !errors.Is(err, ErrUnknownType) {
		t.Errorf("unknown type: %v, want ErrUnknownType", err)
	}
	if _, err := Decode("sandbox.exited", []byte(`{"code":"seven"}`)); err == nil {
		t.Error("malformed data decoded")
	}
	if e, err := Decode("sandbox.exited", []byte(`{"code":7,"added_later":true}`)); err != nil || e.(*Exited).Code != 7 {
		t.Errorf("a field added by a newer writer must be ignored: %v %v", e, err)
	}
}

func TestCodeOf(t *testing.T) {
	cases := []struct {
		err  error
		code Code
		http int
	}{
		{Errorf(CodeNotFound, "x"), CodeNotFound, 404},
		{fmt.Errorf("wrap: %w", Errorf(CodeUnimplemented, "x")), CodeUnimplemented, 501},
		{fmt.Errorf("append: %w", ErrConflict), CodeAborted, 409},
		{ErrNotFound, CodeNotFound, 404},
		{ErrUnavailable, CodeUnavailable, 503},
		{context.DeadlineExceeded, CodeDeadlineExceeded, 504},
		{fmt.Errorf("load: %w", ErrUnknownType), CodeFailedPrecondition, 409},
		{errors.New("boom"), CodeInternal, 500},
		{Errorf(CodeInvalidArgument, "x"), CodeInvalidArgument, 400},
		{Errorf(CodeResourceExhausted, "x"), CodeResourceExhausted, 429},
		{Errorf(CodeAlreadyExists, "x"), CodeAlreadyExists, 409},
		{Errorf(CodeUnauthenticated, "x"), CodeUnauthenticated, 401},
		{Errorf(CodePermissionDenied, "x"), CodePermissionDenied, 403},
	}
	for _, c := range cases {
		if got := CodeOf(c.err); got != c.code || got.HTTPStatus() != c.http {
			t.Errorf("CodeOf(%v) = %s (%d), want %s (%d)", c.err, got, got.HTTPStatus(), c.code, c.http)
		}
	}
	body, _ := json.Marshal(ErrorBody{Error: AsError(Errorf(CodeFailedPrecondition, "sandbox 0c1 is stopped; resume needs suspended"))})
	if want := `{"error":{"code":"FAILED_PRECONDITION","message":"sandbox 0c1 is stopped; resume needs suspended"}}`; string(body) != want {
		t.Errorf("error body %s, want %s", body, want)
	}
}

// TestFoldNeverGoesBack: a view skips events at or below its seq, events of
// unknown types and events the table refuses (a second exit in error), and
// keeps the first exit code.
func TestFoldNeverGoesBack(t *testing.T) {
	env := func(seq uint64, phase Phase, e Event) Envelope {
		en, _ := NewEnvelope("s1", e, Meta{}, time.Unix(int64(seq), 0))
		en.Seq, en.Phase = seq, phase
		return en
	}
	var v View
	if !v.Fold(env(1, PhaseProvisioning, &Created{Name: "a", Generation: 1})) {
		t.Fatal("created not folded")
	}
	v.Fold(env(3, PhaseError, &Exited{Generation: 1, Code: 3}))
	if v.Fold(env(2, PhaseReady, &SupervisorAttached{Generation: 1})) {
		t.Error("an older event was folded")
	}
	if v.Fold(Envelope{SandboxID: "s1", Type: "sandbox.from_the_future", Seq: 4, Phase: PhaseReady}) {
		t.Error("an unknown type was folded")
	}
	if v.Fold(env(5, PhaseError, &Exited{Generation: 1, Code: 9})) {
		t.Error("an exit in error was folded")
	}
	if v.Phase != PhaseError || v.Seq != 3 || v.ExitCode == nil || *v.ExitCode != 3 || v.Labels == nil {
		t.Errorf("view %+v", v)
	}
}

// TestFoldOutcomes: last_outcome and reason say how the last suspend or
// resume ended (CONTRACT §6), whatever path it took.
func TestFoldOutcomes(t *testing.T) {
	cases := []struct {
		name    string
		from    Phase
		steps   []Event
		phases  []Phase
		outcome string
		reason  string
	}{
		{"strict restore failure after the consumption", PhaseSuspended,
			[]Event{&ResumeRequested{Generation: 2, RestoreRef: "r"}, &RetainedStateConsumed{Generation: 2, RestoreRef: "r"}, &Stopped{Generation: 2, Reason: ReasonRetainedStateLost}},
			[]Phase{PhaseStarting, PhaseStarting, PhaseStopped}, OutcomeRestoreFailed, ReasonRetainedStateLost},
		{"a restore after a strict failure and a cold start", PhaseStarting,
			[]Event{&Stopped{Generation: 2, Reason: ReasonRetainedStateLost}, &StartRequested{Generation: 3}, &SupervisorAttached{Generation: 3}},
			[]Phase{PhaseStopped, PhaseStarting, PhaseReady}, OutcomeRestoreFailed, ""},
		{"a hung suspension cancelled at its deadline, the workload running", PhaseReady,
			[]Event{&SuspendRequested{Generation: 1}, &SuspendRejected{Generation: 1, Reason: ReasonDeadlineExceeded}, &DeadlinePassed{Phase: PhaseSuspending}},
			[]Phase{PhaseSuspending, PhaseReady, PhaseReady}, OutcomeSuspendTimedOut, ReasonDeadlineExceeded},
		{"a resume past its deadline before the consumption", PhaseSuspended,
			[]Event{&ResumeRequested{Generation: 2, RestoreRef: "r"}, &ResumeFailed{Generation: 2}, &DeadlinePassed{Phase: PhaseStarting}},
			[]Phase{PhaseStarting, PhaseSuspended, PhaseSuspended}, OutcomeRestoreFailed, ReasonDeadlineExceeded},
		{"a rejected suspension", PhaseReady,
			[]Event{&SuspendRequested{Generation: 1}, &SuspendRejected{Generation: 1}},
			[]Phase{PhaseSuspending, PhaseReady}, OutcomeSuspendRejected, ReasonSuspendRejected},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := View{Phase: c.from}
			for i, e := range c.steps {
				en, _ := NewEnvelope("s1", e, Meta{}, time.Unix(int64(i), 0))
				en.Seq, en.Phase = uint64(i+1), c.phases[i]
				v.Fold(en)
			}
			if v.LastOutcome != c.outcome || v.Reason != c.reason {
				t.Fatalf("last_outcome %q reason %q, want %q and %q", v.LastOutcome, v.Reason, c.outcome, c.reason)
			}
		})
	}
}

// TestFoldPhaseSince: phase_since is the time of the event that moved the
// view into its current phase; an event that leaves the phase leaves it
// (CONTRACT §6), and SortTime falls back to updated_at for a view without
// it.
func TestFoldPhaseSince(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 7).UTC() }
	steps := []struct {
		e     Event
		phase Phase
		since time.Time
	}{
		{&Created{Name: "a", Generation: 1}, PhaseProvisioning, at(10)},
		{&SupervisorAttached{Generation: 1}, PhaseReady, at(11)},
		{&ForwardOpened{ForwardID: "f1", Listen: "127.0.0.1:0", Address: "127.0.0.1:1", Port: 80}, PhaseReady, at(11)},
		{&SuspendRequested{Generation: 1}, PhaseSuspending, at(13)},
		{&Suspended{Generation: 1, RestoreRef: "r"}, PhaseSuspended, at(14)},
		{&ResumeRequested{Generation: 2, RestoreRef: "r"}, PhaseStarting, at(15)},
		{&RetainedStateConsumed{Generation: 2, RestoreRef: "r"}, PhaseStarting, at(15)},
		{&Resumed{Generation: 2, Outcome: OutcomeRestored}, PhaseStarting, at(15)},
		{&SupervisorAttached{Generation: 2}, PhaseReady, at(18)},
	}
	var v View
	for i, s := range steps {
		en, err := NewEnvelope("s1", s.e, Meta{}, at(int64(10+i)))
		if err != nil {
			t.Fatal(err)
		}
		en.Seq = uint64(i + 1)
		if _, err := v.Apply(en); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if v.Phase != s.phase || !v.PhaseSince.Equal(s.since) {
			t.Errorf("after %T: phase %s since %s, want %s since %s", s.e, v.Phase, v.PhaseSince, s.phase, s.since)
		}
	}
	if got := v.SortTime(); !got.Equal(at(18)) {
		t.Errorf("SortTime %s, want phase_since %s", got, at(18))
	}
	old := View{UpdatedAt: at(3)}
	if got := old.SortTime(); !got.Equal(at(3)) {
		t.Errorf("SortTime of a view without phase_since %s, want updated_at %s", got, at(3))
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"phase_since":"1970-01-01T00:00:18.000000007Z"`; !strings.Contains(string(b), want) {
		t.Errorf("view JSON %s: want %s", b, want)
	}
	if b, _ := json.Marshal(old); strings.Contains(string(b), "phase_since") {
		t.Errorf("view without phase_since: JSON %s names it", b)
	}
}

// TestFoldLastActiveAt: last_active_at is the time of the latest activity
// (README "Activity"): an event a client's command appended, at its time,
// or a sandbox.active, at its At; the outcomes sagas and supervisors
// report leave it, and it never goes back.
func TestFoldLastActiveAt(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 3).UTC() }
	steps := []struct {
		e      Event
		active time.Time // last_active_at after the event
	}{
		{&Created{Name: "a", Generation: 1}, at(10)},
		{&Started{Generation: 1}, at(10)},
		{&SupervisorAttached{Generation: 1}, at(10)},
		{&Active{Source: ActiveTouch, At: at(12)}, at(12)},
		{&Active{Source: ActiveForward, At: at(5)}, at(12)}, // seen earlier, recorded late: never back
		{&Active{Source: ActiveForward}, at(15)},            // no At: the envelope's time
		{&ForwardOpened{ForwardID: "f1", Port: 80}, at(16)},
		{&SuspendRequested{Generation: 1}, at(17)},
		{&Suspended{Generation: 1, RestoreRef: "r"}, at(17)},
		{&ResumeRequested{Generation: 2, RestoreRef: "r"}, at(19)},
		{&RetainedStateConsumed{Generation: 2, RestoreRef: "r"}, at(19)},
		{&StartRequested{Generation: 3, Fallback: true}, at(19)},
		{&SupervisorAttached{Generation: 3}, at(19)},
		{&Exited{Generation: 3, Code: 1}, at(19)},
		{&DeleteRequested{}, at(24)},
	}
	var v View
	for i, s := range steps {
		en, err := NewEnvelope("s1", s.e, Meta{}, at(int64(10+i)))
		if err != nil {
			t.Fatal(err)
		}
		en.Seq = uint64(i + 1)
		if _, err := v.Apply(en); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if !v.LastActiveAt.Equal(s.active) {
			t.Errorf("after %T (step %d): last_active_at %s, want %s", s.e, i, v.LastActiveAt, s.active)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"last_active_at":"1970-01-01T00:00:24.000000003Z"`; !strings.Contains(string(b), want) {
		t.Errorf("view JSON %s: want %s", b, want)
	}
	if b, _ := json.Marshal(View{ID: "s2"}); strings.Contains(string(b), "last_active_at") {
		t.Errorf("view without activity: JSON %s names it", b)
	}
}

// TestFoldExpiryPaused: with ttl_pauses_while_suspended, the view's
// expires_at moves later by each stay in suspended, added as the stay
// ends (the event that leaves suspended), and expiry_paused says a stay
// is under way; without it expires_at is created's throughout.
func TestFoldExpiryPaused(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 5).UTC() }
	steps := []struct {
		e       Event // at second 10 + its index
		expires time.Time
		paused  bool
	}{
		{&Created{Name: "a", Generation: 1, ExpiresAt: at(100), OnExpiry: OnExpiryDelete}, at(100), false},
		{&SupervisorAttached{Generation: 1}, at(100), false},
		{&SuspendRequested{Generation: 1}, at(100), false},
		{&Suspended{Generation: 1, RestoreRef: "r"}, at(100), true},
		{&ForwardOpened{ForwardID: "f1", Port: 80}, at(100), true},
		{&ResumeRequested{Generation: 2, RestoreRef: "r"}, at(102), false}, // suspended from 13 to 15
		{&ResumeFailed{Generation: 2, Message: "no"}, at(102), true},
		{&StartRequested{Generation: 3}, at(103), false}, // suspended from 16 to 17
		{&SupervisorAttached{Generation: 3}, at(103), false},
	}
	for _, pauses := range []bool{true, false} {
		var v View
		for i, s := range steps {
			e := s.e
			if c, ok := e.(*Created); ok {
				cc := *c
				cc.TTLPausesWhileSuspended = pauses
				e = &cc
			}
			en, err := NewEnvelope("s1", e, Meta{}, at(int64(10+i)))
			if err != nil {
				t.Fatal(err)
			}
			en.Seq = uint64(i + 1)
			if _, err := v.Apply(en); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			want, paused := s.expires, s.paused
			if !pauses {
				want, paused = at(100), false
			}
			if !v.ExpiresAt.Equal(want) || v.ExpiryPaused != paused {
				t.Errorf("pauses %v, after %T (step %d): expires_at %s paused %v, want %s paused %v", pauses, e, i, v.ExpiresAt, v.ExpiryPaused, want, paused)
			}
		}
	}
	var v View
	b, _ := json.Marshal(View{ID: "s2", ExpiresAt: at(100), TTLPausesWhileSuspended: true, ExpiryPaused: true})
	if err := json.Unmarshal(b, &v); err != nil || !v.ExpiryPaused || !v.TTLPausesWhileSuspended {
		t.Errorf("view JSON %s: want ttl_pauses_while_suspended and expiry_paused back, got %+v (%v)", b, v, err)
	}
	if b, _ := json.Marshal(View{ID: "s2"}); strings.Contains(string(b), "paused") {
		t.Errorf("view without the option: JSON %s names it", b)
	}
}

func ExampleCodeOf() {
	err := fmt.Errorf("suspend x: %w", Errorf(CodeUnimplemented, "driver sim cannot suspend"))
	fmt.Println(CodeOf(err), CodeOf(err).HTTPStatus())
	// Output: UNIMPLEMENTED 501
}

// TestHistoryEntryRoundTrip: an envelope listed in the history and read
// back from it is the envelope the log holds (but for the store's MsgID).
func TestHistoryEntryRoundTrip(t *testing.T) {
	env := Envelope{ID: "e1", SandboxID: "s1", Type: TypeResumed, Schema: SchemaVersion, Time: time.Unix(1700000000, 5).UTC(),
		Actor: "supervisor:2", CommandID: "c1", CorrelationID: "k1", CausationID: "r1", Phase: PhaseStarting,
		Data: json.RawMessage(`{"generation":2,"outcome":"restored"}`), Seq: 42}
	if got := env.HistoryEntry().Envelope("s1"); !reflect.DeepEqual(got, env) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, env)
	}
}
