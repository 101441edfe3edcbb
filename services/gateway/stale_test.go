package gateway

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// TestRecordAtTheHead: a report recorded through a gateway whose cache is
// behind the log (another instance moved the sandbox since) is judged
// again on the subject's head before it is refused: a suspend, stop or
// deadline outcome the stale instance would refuse is taken, and a report
// that is wrong at the head too is still refused (FAILED_PRECONDITION).
func TestRecordAtTheHead(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// moves is what instance a does after b cached the ready sandbox.
		moves func(t *testing.T, a *Service, id string)
		// report is what b then records.
		report events.Event
		// code is the answer wanted ("" taken), phase the phase after.
		code  events.Code
		phase events.Phase
	}{
		{"suspended", command(VerbSuspend), &events.Suspended{Generation: 1, RestoreRef: "ref-1"}, "", events.PhaseSuspended},
		{"stopped", command(VerbStop), &events.Stopped{Generation: 1}, "", events.PhaseStopped},
		{"deadline", command(VerbSuspend), &events.DeadlinePassed{Phase: events.PhaseSuspending, Deadline: "1ns"}, "", events.PhaseError},
		{"a stop outcome while suspending", command(VerbSuspend), &events.Stopped{Generation: 1}, events.CodeFailedPrecondition, events.PhaseSuspending},
		{"an exit of a generation stopped and started since", func(t *testing.T, a *Service, id string) {
			command(VerbStop)(t, a, id)
			if err := a.Record(ctx, events.Envelope{SandboxID: id}, "test", &events.Stopped{Generation: 1}); err != nil {
				t.Fatal(err)
			}
			command(VerbStart)(t, a, id)
		}, &events.Exited{Generation: 1, Code: 3}, events.CodeFailedPrecondition, events.PhaseStarting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			a, b := r.service(t), r.service(t)
			v := readySandbox(t, a)
			if _, err := b.Sandbox(ctx, v.ID); err != nil { // b caches it ready
				t.Fatal(err)
			}
			tc.moves(t, a, v.ID)
			err := b.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", tc.report)
			if got := events.CodeOf(err); got != tc.code {
				t.Fatalf("%s recorded through the stale instance: %v (code %q), want code %q", tc.report.Type(), err, got, tc.code)
			}
			sb, err := r.service(t).Sandbox(ctx, v.ID)
			if err != nil || sb.Phase != tc.phase {
				t.Fatalf("after the report: %+v, %v; want %s", sb, err, tc.phase)
			}
		})
	}
}

// TestResumedAttachAtTheHead: the attach of a resumed generation reaching a
// gateway that cached the sandbox suspended (another instance took the
// resume, and the saga recorded the restore through it) is taken, and the
// sandbox is ready; it was fenced ("speaks for generation 2, current is
// 1") and lost.
func TestResumedAttachAtTheHead(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	a, b := r.service(t), r.service(t)
	v := readySandbox(t, a)
	command(VerbSuspend)(t, a, v.ID)
	if err := a.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Suspended{Generation: 1, RestoreRef: "ref-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sandbox(ctx, v.ID); err != nil { // b caches it suspended, generation 1
		t.Fatal(err)
	}
	command(VerbResume)(t, a, v.ID)
	if err := a.Record(ctx, events.Envelope{SandboxID: v.ID}, "test",
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}); err != nil {
		t.Fatal(err)
	}
	attach, _ := json.Marshal(compute.Report{SandboxID: v.ID, Generation: 2, Credential: r.creds.Mint(v.ID, 2), Kind: compute.ReportAttached})
	if _, err := b.Report(ctx, v.ID, attach); err != nil {
		t.Fatalf("attach of the resumed generation through the stale instance: %v", err)
	}
	sb, err := r.service(t).Sandbox(ctx, v.ID)
	if err != nil || sb.Phase != events.PhaseReady || sb.Attached != 2 || sb.RestoreRef != "" || sb.Restored != 2 {
		t.Fatalf("after the attach: %+v, %v; want ready, generation 2 attached and restored, nothing held", sb, err)
	}
	n := countTypes(t, r.store, v.ID)
	if n[events.TypeRetainedStateConsumed] != 1 || n[events.TypeResumed] != 1 || n[events.TypeSupervisorAttached] != 2 {
		t.Fatalf("log %v: want the consumption and the restore once, two attaches", n)
	}
}

// command returns a step that runs verb on a sandbox through svc.
func command(verb string) func(t *testing.T, svc *Service, id string) {
	return func(t *testing.T, svc *Service, id string) {
		t.Helper()
		if _, err := svc.Handle(context.Background(), Command{Verb: verb, ID: id}); err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
	}
}

// TestReattachAtTheHead: a supervisor recorded detached by one gateway
// attaches again through another that cached it attached: the attach is
// taken (the sandbox ready again, the log showing the detach and the new
// attach) and its beats are taken after. The stale instance took the
// attach for a repeat of one recorded already, appended nothing and
// answered OK, and the sandbox stayed provisioning until its deadline put
// it in error.
func TestReattachAtTheHead(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	a, b := r.service(t), r.service(t)
	v := readySandbox(t, a)
	cred := r.creds.Mint(v.ID, 1)
	beat, _ := json.Marshal(compute.Report{SandboxID: v.ID, Generation: 1, Credential: cred, Kind: compute.ReportHeartbeat})
	attach, _ := json.Marshal(compute.Report{SandboxID: v.ID, Generation: 1, Credential: cred, Kind: compute.ReportAttached})
	if _, err := b.Report(ctx, v.ID, beat); err != nil { // b caches it attached
		t.Fatal(err)
	}
	if err := a.Record(ctx, events.Envelope{SandboxID: v.ID}, "gateway:heartbeats", &events.SupervisorDetached{Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Report(ctx, v.ID, attach); err != nil {
		t.Fatalf("attach again through the stale instance: %v", err)
	}
	sb, err := r.service(t).Sandbox(ctx, v.ID)
	if err != nil || sb.Phase != events.PhaseReady || sb.Attached != 1 {
		t.Fatalf("after the attach: %+v, %v; want ready, generation 1 attached", sb, err)
	}
	if n := countTypes(t, r.store, v.ID); n[events.TypeSupervisorDetached] != 1 || n[events.TypeSupervisorAttached] != 2 {
		t.Fatalf("log %v: want one detach between two attaches", n)
	}
	if _, err := b.Report(ctx, v.ID, beat); err != nil {
		t.Fatalf("a beat after the attach: %v", err)
	}
}

// laggingHead is the log as a replicated stream's leader may show it for a
// moment: its head (and what is read above a sequence) behind an event a
// replica already delivered, for the first behind reads of Head.
type laggingHead struct {
	events.Store
	mu     sync.Mutex
	behind int
	at     uint64 // the head it shows while behind
}

func (l *laggingHead) Head(ctx context.Context, id string) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.behind > 0 {
		l.behind--
		return l.at, nil
	}
	return l.Store.Head(ctx, id)
}

// TestReportWaitsForItsCause: a resume's outcome reported through an
// instance that cached the sandbox suspended, while the log's head it reads
// still lags the resume_requested that caused the report (a saga's
// consumer on a replica ahead of the leader), is judged once the state
// holds its cause, and taken. It was fenced ("retained_state_consumed
// speaks for generation 2, current is 1") and the saga's outcome dropped,
// the sandbox left in starting (the bench's cluster row).
func TestReportWaitsForItsCause(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	a := r.service(t)
	lag := &laggingHead{Store: r.store}
	b, err := NewService(lag, r.names, fakeDrivers{}, r.creds, Config{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	v := readySandbox(t, a)
	command(VerbSuspend)(t, a, v.ID)
	if err := a.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Suspended{Generation: 1, RestoreRef: "ref-1"}); err != nil {
		t.Fatal(err)
	}
	sb, err := b.Sandbox(ctx, v.ID) // b caches it suspended, generation 1
	if err != nil {
		t.Fatal(err)
	}
	command(VerbResume)(t, a, v.ID)
	envs, err := r.store.Load(ctx, v.ID, sb.Seq)
	if err != nil || len(envs) != 1 {
		t.Fatalf("after the resume: %d events, %v; want the resume_requested", len(envs), err)
	}
	lag.mu.Lock()
	lag.behind, lag.at = 3, sb.Seq
	lag.mu.Unlock()
	if err := b.Record(ctx, envs[0], "sagas", &events.RetainedStateConsumed{Generation: 2, RestoreRef: "ref-1"}); err != nil {
		t.Fatalf("the consumption caused by the resume_requested at %d, the head read at %d: %v", envs[0].Seq, sb.Seq, err)
	}
	if n := countTypes(t, r.store, v.ID); n[events.TypeRetainedStateConsumed] != 1 {
		t.Fatalf("log %v: want the consumption once", n)
	}
}

// laggingStore is a store whose first Load of a sandbox from its start
// leaves out the last behind events, as a replica catching up serves it (a
// read of a replicated log may be answered by a follower); its Head is
// the leader's word, and later loads are whole.
type laggingStore struct {
	events.Store
	behind int
	mu     sync.Mutex
	lagged map[string]bool
}

func (s *laggingStore) Load(ctx context.Context, id string, after uint64) ([]events.Envelope, error) {
	envs, err := s.Store.Load(ctx, id, after)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || after != 0 || s.lagged[id] || len(envs) <= s.behind {
		return envs, err
	}
	s.lagged[id] = true
	return envs[:len(envs)-s.behind], nil
}

// TestRefusalOfAFreshReadAtTheHead: a command refused on a state read from
// the log, not the cache, is decided again at the subject's head before
// the refusal is answered: the read may have been served by a replica
// behind the log (TestClusterFaults saw a stop refused "starting" after
// the sandbox was ready). Here an instance that never saw the sandbox
// reads it ready where the log has it suspended: its resume is taken, and
// a command wrong at the head too is still refused.
func TestRefusalOfAFreshReadAtTheHead(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		verb  string
		code  events.Code
		phase events.Phase
	}{
		{VerbResume, "", events.PhaseStarting},
		{VerbStop, events.CodeFailedPrecondition, events.PhaseSuspended},
	} {
		t.Run(tc.verb, func(t *testing.T) {
			r := newRig(t)
			a := r.service(t)
			v := readySandbox(t, a)
			command(VerbSuspend)(t, a, v.ID)
			if err := a.Record(ctx, events.Envelope{SandboxID: v.ID}, "test", &events.Suspended{Generation: 1, RestoreRef: "ref-1"}); err != nil {
				t.Fatal(err)
			}
			lagging := &laggingStore{Store: r.store, behind: 2, lagged: map[string]bool{}}
			b, err := NewService(lagging, r.names, fakeDrivers{}, r.creds, Config{}, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.Handle(ctx, Command{Verb: tc.verb, ID: v.ID})
			if got := events.CodeOf(err); got != tc.code {
				t.Fatalf("%s through an instance whose read lagged: %v (code %q), want code %q", tc.verb, err, got, tc.code)
			}
			if !lagging.lagged[v.ID] {
				t.Fatal("the read did not lag: the test tests nothing")
			}
			sb, err := r.service(t).Sandbox(ctx, v.ID)
			if err != nil || sb.Phase != tc.phase {
				t.Fatalf("after the %s: %+v, %v; want %s", tc.verb, sb, err, tc.phase)
			}
		})
	}
}
