package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/sim"
	"github.com/torpor/torpor/services/node"
)

// scene is one scenario's sandbox on a real service.
type scene struct {
	t     *testing.T
	c     *torpor.Client
	nc    *nats.Conn
	creds *compute.Credentials
	dir   string
	id    string
}

// report sends a supervisor report of generation gen with cred (minted for
// gen when empty) and returns the code it was answered with ("" taken).
func (s *scene) report(gen int64, cred, kind string, code int) events.Code {
	s.t.Helper()
	if cred == "" {
		cred = s.creds.Mint(s.id, gen)
	}
	body, _ := json.Marshal(compute.Report{SandboxID: s.id, Generation: gen, Credential: cred, Kind: kind, ExitCode: code})
	reply, err := s.nc.Request(compute.ReportSubject(s.id), body, waitFor)
	if err != nil {
		s.t.Fatal(err)
	}
	var eb events.ErrorBody
	if json.Unmarshal(reply.Data, &eb) == nil && eb.Error != nil {
		return eb.Error.Code
	}
	return ""
}

// command sends verb and returns its error's code.
func (s *scene) command(verb, key string, fallback bool) events.Code {
	var err error
	if verb == "delete" {
		_, err = s.c.Delete(context.Background(), s.id, key)
	} else {
		_, err = s.c.Lifecycle(context.Background(), verb, s.id, fallback, key)
	}
	return events.CodeOf(err)
}

// racy are the events whose place in the log races with the outcome around
// them (the driver's answer to a start and the supervisor's attach): a
// scenario counts them apart.
var racy = map[string]bool{events.TypeStarted: true, events.TypeSupervisorAttached: true}

// TestScenarios reads given (a sandbox's sim options and the commands that
// bring it where the scenario starts) / when (a command, a supervisor's
// report) / then (the events appended, and the phase view once settled),
// through the real service. Every log they make is checked for the
// invariants at cleanup (startApp).
func TestScenarios(t *testing.T) {
	dir := t.TempDir()
	a := startApp(t, dir, func(c *serveConfig) { c.Deadline = 2 * time.Second })
	nc := busConn(t, a)
	js, _ := jetstream.New(nc)
	creds, err := node.Credentials(context.Background(), js, 1)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		opts  map[string]string
		given []string // each waits for its phase: suspended, ready, stopped
		when  func(s *scene)
		then  []string // in order, started and attachments apart (racy); nothing when both are empty
		racy  map[string]int
		// anyLog: the events appended may come in more than one order (the
		// invariants are checked all the same).
		anyLog bool
		phase  events.Phase
		view   func(t *testing.T, s *scene, v events.View)
	}{
		{name: "suspend ok",
			when:  func(s *scene) { s.want(s.command("suspend", "", false), "") },
			then:  []string{events.TypeSuspendRequested, events.TypeSuspended},
			phase: events.PhaseSuspended,
			view: func(t *testing.T, s *scene, v events.View) {
				if !v.Restore.Held || v.Generation != 1 {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "suspend rejected: back to ready", opts: map[string]string{"suspend": "reject"},
			when:  func(s *scene) { s.want(s.command("suspend", "", false), "") },
			then:  []string{events.TypeSuspendRequested, events.TypeSuspendRejected},
			phase: events.PhaseReady,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.LastOutcome != events.OutcomeSuspendRejected || v.Reason != events.ReasonSuspendRejected || v.Restore.Held {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "suspend unimplemented: nothing moves", opts: map[string]string{"suspend": "unimplemented"},
			when:  func(s *scene) { s.want(s.command("suspend", "", false), events.CodeUnimplemented) },
			phase: events.PhaseReady},
		{name: "suspend hung past its deadline, the workload running: ready", opts: map[string]string{"suspend": "hang"},
			when:  func(s *scene) { s.want(s.command("suspend", "", false), "") },
			then:  []string{events.TypeSuspendRequested, events.TypeSuspendRejected, events.TypeDeadlinePassed},
			phase: events.PhaseReady,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.LastOutcome != events.OutcomeSuspendTimedOut || v.Reason != events.ReasonDeadlineExceeded {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "suspend hung past its deadline, the workload not confirmed running: error", opts: map[string]string{"suspend": "hang", "observe": "unknown"},
			when:  func(s *scene) { s.want(s.command("suspend", "", false), "") },
			then:  []string{events.TypeSuspendRequested, events.TypeDeadlinePassed},
			phase: events.PhaseError,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.Reason != events.ReasonDeadlineExceeded {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "an exit during the suspension: error, the code kept, the late reference released", opts: map[string]string{"exit_during_suspend": "3"},
			when:  func(s *scene) { s.want(s.command("suspend", "", false), "") },
			then:  []string{events.TypeSuspendRequested, events.TypeExited},
			phase: events.PhaseError,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.ExitCode == nil || *v.ExitCode != 3 || v.Reason != events.ReasonMainProcessExited || v.Restore.Held {
					t.Errorf("view %+v", v)
				}
				awaitEffect(t, s.dir, sim.Effect{Sandbox: s.id, Generation: 1, Op: "discard"})
			}},
		{name: "the retained workload dies while suspended: error, the state invalidated", given: []string{"suspend"},
			when:  func(s *scene) { s.want(s.report(1, "", compute.ReportExited, 137), "") },
			then:  []string{events.TypeExited, events.TypeRetainedStateInvalidated},
			phase: events.PhaseError,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.ExitCode == nil || *v.ExitCode != 137 || v.Restore.Held {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "reports of the old generation after a resume change nothing", given: []string{"suspend", "resume"},
			when: func(s *scene) {
				for _, kind := range []string{compute.ReportExited, compute.ReportAttached, compute.ReportDetached, compute.ReportHeartbeat} {
					s.want(s.report(1, "", kind, 9), events.CodeFailedPrecondition)
				}
				// Nor does the new generation with the old one's credential.
				s.want(s.report(2, s.creds.Mint(s.id, 1), compute.ReportExited, 9), events.CodeUnauthenticated)
			},
			phase: events.PhaseReady,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.Generation != 2 || v.ExitCode != nil {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "resume ok: the next generation, restored", given: []string{"suspend"},
			when:  func(s *scene) { s.want(s.command("resume", "", false), "") },
			then:  []string{events.TypeResumeRequested, events.TypeRetainedStateConsumed, events.TypeResumed},
			racy:  map[string]int{events.TypeSupervisorAttached: 1},
			phase: events.PhaseReady,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.Generation != 2 || v.LastOutcome != events.OutcomeRestored || v.Restore.Held || !v.Restore.Consumed {
					t.Errorf("view %+v", v)
				}
				// A fresh credential: the first generation's does not speak for it.
				s.want(s.report(2, s.creds.Mint(s.id, 1), compute.ReportAttached, 0), events.CodeUnauthenticated)
			}},
		{name: "a restore fails before consuming, then the retry restores the same reference", opts: map[string]string{"resume": "fail_once"}, given: []string{"suspend"},
			when: func(s *scene) {
				acc, err := s.c.Lifecycle(context.Background(), "resume", s.id, false, "")
				s.want(events.CodeOf(err), "")
				if _, err := s.c.WaitAfter(context.Background(), s.id, events.PhaseSuspended, acc.Seq, waitFor); err != nil {
					s.t.Fatal(err)
				}
				s.want(s.command("resume", "", false), "")
			},
			then: []string{events.TypeResumeRequested, events.TypeResumeFailed, events.TypeResumeRequested,
				events.TypeRetainedStateConsumed, events.TypeResumed},
			racy:  map[string]int{events.TypeSupervisorAttached: 1},
			phase: events.PhaseReady,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.Generation != 3 || v.LastOutcome != events.OutcomeRestored {
					t.Errorf("view %+v", v)
				}
				var refs []string
				for _, e := range s.history() {
					if e.Type == events.TypeResumeRequested {
						var r events.ResumeRequested
						_ = json.Unmarshal(e.Data, &r)
						refs = append(refs, r.RestoreRef)
					}
				}
				if len(refs) != 2 || refs[0] == "" || refs[0] != refs[1] {
					t.Errorf("the two resumes restored %q", refs)
				}
			}},
		{name: "a restore fails after consuming, strict: stopped, the state lost", opts: map[string]string{"resume": "fail_after_consume"}, given: []string{"suspend"},
			when:  func(s *scene) { s.want(s.command("resume", "", false), "") },
			then:  []string{events.TypeResumeRequested, events.TypeRetainedStateConsumed, events.TypeStopped},
			phase: events.PhaseStopped,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.Reason != events.ReasonRetainedStateLost || v.LastOutcome != events.OutcomeRestoreFailed || v.Restore.Held {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "a restore fails after consuming, with the fallback: a cold start", opts: map[string]string{"resume": "fail_after_consume"}, given: []string{"suspend"},
			when:  func(s *scene) { s.want(s.command("resume", "", true), "") },
			then:  []string{events.TypeResumeRequested, events.TypeRetainedStateConsumed, events.TypeStartRequested},
			racy:  map[string]int{events.TypeStarted: 1, events.TypeSupervisorAttached: 1},
			phase: events.PhaseReady,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.Generation != 3 || v.LastOutcome != events.OutcomeColdStartFallback || v.Restore.Held {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "a resume past its deadline before consuming: suspended, retryable", opts: map[string]string{"resume": "hang"}, given: []string{"suspend"},
			when:  func(s *scene) { s.want(s.command("resume", "", false), "") },
			then:  []string{events.TypeResumeRequested, events.TypeResumeFailed, events.TypeDeadlinePassed},
			phase: events.PhaseSuspended,
			view: func(t *testing.T, s *scene, v events.View) {
				if !v.Restore.Held || v.Reason != events.ReasonDeadlineExceeded || v.LastOutcome != events.OutcomeRestoreFailed {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "an explicit start of a suspended sandbox discards its state", given: []string{"suspend"},
			when:  func(s *scene) { s.want(s.command("start", "", false), "") },
			then:  []string{events.TypeStartRequested, events.TypeRetainedStateDiscarded},
			racy:  map[string]int{events.TypeStarted: 1, events.TypeSupervisorAttached: 1},
			phase: events.PhaseReady,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.Generation != 2 || v.Restore.Held {
					t.Errorf("view %+v", v)
				}
				awaitEffect(t, s.dir, sim.Effect{Sandbox: s.id, Generation: 1, Op: "discard"})
			}},
		{name: "a delete while suspended invalidates the reference", given: []string{"suspend"},
			when:  func(s *scene) { s.want(s.command("delete", "", false), "") },
			then:  []string{events.TypeDeleteRequested, events.TypeRetainedStateInvalidated, events.TypeDeleted},
			phase: events.PhaseDeleted,
			view: func(t *testing.T, s *scene, v events.View) {
				if v.Restore.Held {
					t.Errorf("view %+v", v)
				}
			}},
		{name: "two resumes at once: one resume", given: []string{"suspend"},
			when:  func(s *scene) { s.together("resume", "resume") },
			then:  []string{events.TypeResumeRequested, events.TypeRetainedStateConsumed, events.TypeResumed},
			racy:  map[string]int{events.TypeSupervisorAttached: 1},
			phase: events.PhaseReady},
		{name: "a suspend and a delete at once: deleted", anyLog: true,
			when:  func(s *scene) { s.together("suspend", "delete") },
			phase: events.PhaseDeleted},
		{name: "a command retried with its key lands once, even after the sandbox moved on",
			when: func(s *scene) {
				ctx := context.Background()
				acc, err := s.c.Lifecycle(ctx, "stop", s.id, false, "stop-key")
				s.want(events.CodeOf(err), "")
				if _, err := s.c.WaitAfter(ctx, s.id, events.PhaseStopped, acc.Seq, waitFor); err != nil {
					s.t.Fatal(err)
				}
				if acc, err = s.c.Lifecycle(ctx, "start", s.id, false, ""); err != nil {
					s.t.Fatal(err)
				}
				if _, err := s.c.WaitAfter(ctx, s.id, events.PhaseReady, acc.Seq, waitFor); err != nil {
					s.t.Fatal(err)
				}
				// The stop's retry, late: without its key it would stop the
				// sandbox again.
				s.want(s.command("stop", "stop-key", false), "")
			},
			then:  []string{events.TypeStopRequested, events.TypeStopped, events.TypeStartRequested},
			racy:  map[string]int{events.TypeStarted: 1, events.TypeSupervisorAttached: 1},
			phase: events.PhaseReady},
	}
	wait := map[string]events.Phase{"suspend": events.PhaseSuspended, "resume": events.PhaseReady, "stop": events.PhaseStopped, "start": events.PhaseReady}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := &scene{t: t, c: appClient(a), nc: nc, creds: creds, dir: dir}
			v, err := s.c.Create(ctx, torpor.CreateRequest{Driver: "sim", DriverOptions: tc.opts}, "")
			if err != nil {
				t.Fatal(err)
			}
			s.id = v.ID
			mustWait(t, s.c, s.id, events.PhaseReady)
			for _, verb := range tc.given {
				acc, err := s.c.Lifecycle(ctx, verb, s.id, false, "")
				if err != nil {
					t.Fatalf("given %s: %v", verb, err)
				}
				if _, err := s.c.WaitAfter(ctx, s.id, wait[verb], acc.Seq, waitFor); err != nil {
					t.Fatalf("given %s: %v", verb, err)
				}
			}
			base := uint64(0)
			if h := s.settled(); len(h) > 0 {
				base = h[len(h)-1].Seq
			}
			tc.when(s)
			var got events.View
			if len(tc.then) == 0 && len(tc.racy) == 0 && !tc.anyLog {
				// Nothing may be appended: the view stays where it was.
				s.then(base, nil, nil)
				if got, err = s.c.Get(ctx, s.id); err != nil || got.Phase != tc.phase || got.Seq != base {
					t.Fatalf("then: %+v, %v; want %s at seq %d, unchanged", got, err, tc.phase, base)
				}
			} else {
				if got, err = s.c.WaitAfter(ctx, s.id, tc.phase, base, waitFor); err != nil {
					t.Fatalf("then: wait for %s: %v (view %+v)", tc.phase, err, got)
				}
				if !tc.anyLog {
					// The view checked is the one with everything then
					// holds folded in: the phase may come before the last
					// of it (exited, then the state invalidated).
					if last := s.then(base, tc.then, tc.racy); last > got.Seq {
						if got, err = s.c.WaitAfter(ctx, s.id, tc.phase, last-1, waitFor); err != nil {
							t.Fatalf("then: wait for %s at seq %d: %v", tc.phase, last, err)
						}
					}
				}
			}
			if tc.view != nil {
				tc.view(t, s, got)
			}
		})
	}
}

// want fails the scenario unless got is want.
func (s *scene) want(got, want events.Code) {
	s.t.Helper()
	if got != want {
		s.t.Fatalf("answered %q, want %q", got, want)
	}
}

// together sends the verbs at once and wants each to succeed.
func (s *scene) together(verbs ...string) {
	s.t.Helper()
	var wg sync.WaitGroup
	codes := make([]events.Code, len(verbs))
	for i, verb := range verbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = s.command(verb, "", false)
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != "" && c != events.CodeFailedPrecondition {
			s.t.Fatalf("%s at once: %q", verbs[i], c)
		}
	}
}

func (s *scene) history() []torpor.Event {
	s.t.Helper()
	h, err := s.c.History(context.Background(), s.id, 0)
	if err != nil {
		s.t.Fatal(err)
	}
	return h
}

// settled waits until every supervisor attached in the sandbox's log has
// the saga's outcome that started or resumed it, and returns the history.
// The view is ready at the attach, which may come before the saga records
// sandbox.started: a scenario that took its base in between counted the
// create's started as one of its own.
func (s *scene) settled() []torpor.Event {
	s.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		h := s.history()
		n := map[string]int{}
		for _, e := range h {
			n[e.Type]++
		}
		if n[events.TypeStarted]+n[events.TypeResumed] >= n[events.TypeSupervisorAttached] {
			return h
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the log never held a started or resumed for each of its %d attaches: %v", n[events.TypeSupervisorAttached], n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// then waits until the log holds the events of want (in order) and racy
// (counted) after base, fails unless it holds exactly those, and returns
// the seq of the last.
func (s *scene) then(base uint64, want []string, racyWant map[string]int) uint64 {
	s.t.Helper()
	n := len(want)
	for _, k := range racyWant {
		n += k
	}
	var after []torpor.Event
	deadline := time.Now().Add(waitFor)
	for {
		after = after[:0]
		for _, e := range s.history() {
			if e.Seq > base {
				after = append(after, e)
			}
		}
		if len(after) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var ordered []string
	counted := map[string]int{}
	for _, e := range after {
		if racy[e.Type] {
			counted[e.Type]++
			continue
		}
		ordered = append(ordered, e.Type)
	}
	if !slices.Equal(ordered, want) || fmt.Sprint(counted) != fmt.Sprint(orEmpty(racyWant)) {
		s.t.Fatalf("then: appended %v and %v; want %v and %v", ordered, counted, want, racyWant)
	}
	if len(after) == 0 {
		return base
	}
	return after[len(after)-1].Seq
}

func orEmpty(m map[string]int) map[string]int {
	if m == nil {
		return map[string]int{}
	}
	return m
}
