package sqlview

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func newID(t testing.TB) string {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatalf("uuid: %v", err)
	}
	return id.String()
}

// ev is one event of a script: for a sandbox, the phase after it.
type ev struct {
	id    string
	phase events.Phase
	e     events.Event
}

// envelopes wraps a script, each event a little more than a second after
// the one before (nanoseconds included: PostgreSQL keeps microseconds), with
// Seq from 1 as a fresh log would give them.
func envelopes(t testing.TB, script []ev) []events.Envelope {
	t.Helper()
	out := make([]events.Envelope, len(script))
	for i, s := range script {
		env, err := events.NewEnvelope(s.id, s.e, events.Meta{Actor: "test", CommandID: fmt.Sprint("cmd-", i)},
			t0.Add(time.Duration(i)*(time.Second+1234567*time.Nanosecond)))
		if err != nil {
			t.Fatalf("envelope: %v", err)
		}
		env.Phase, env.Seq = s.phase, uint64(i+1)
		out[i] = env
	}
	return out
}

// lifecycle is a scripted log that takes sandboxes through every branch of
// the view's fold: labels, a cold-start fallback, a held snapshot with its
// size, a restore that moves node, rejected and timed-out suspends, an
// exit code, a lost resource, forwards opened and closed, deletion.
func lifecycle(t testing.TB) []ev {
	a, b, c, d := newID(t), newID(t), newID(t), newID(t)
	return []ev{
		{a, events.PhaseProvisioning, &events.Created{Name: "a", Driver: "sim", Node: "n1", Labels: map[string]string{"team": "x", "tier": "gold"}, Generation: 1}},
		{b, events.PhaseProvisioning, &events.Created{Name: "b", Driver: "process", Node: "n1", Labels: map[string]string{"team": "y"}, Generation: 1}},
		{a, events.PhaseProvisioning, &events.Started{Generation: 1, CredentialHash: "h"}},
		{c, events.PhaseProvisioning, &events.Created{Name: "c", Driver: "vm", Node: "n2", Generation: 1}},
		{b, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{a, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{a, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{a, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "r1", Bytes: 4096}},
		{c, events.PhaseReady, &events.SupervisorAttached{Generation: 1}},
		{a, events.PhaseStarting, &events.ResumeRequested{Generation: 2, RestoreRef: "r1"}},
		{a, events.PhaseStarting, &events.RetainedStateConsumed{Generation: 2, RestoreRef: "r1", Node: "n2"}},
		{a, events.PhaseStarting, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}},
		{a, events.PhaseReady, &events.SupervisorAttached{Generation: 2}},
		{c, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{c, events.PhaseReady, &events.SuspendRejected{Generation: 1, Reason: events.ReasonDeadlineExceeded}},
		{c, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{c, events.PhaseReady, &events.SuspendRejected{Generation: 1}},
		{a, events.PhaseReady, &events.ForwardOpened{ForwardID: "f1", Listen: "127.0.0.1:0", Address: "127.0.0.1:4001", Port: 80}},
		{a, events.PhaseReady, &events.ForwardOpened{ForwardID: "f2", Listen: "127.0.0.1:0", Address: "127.0.0.1:4002", Port: 22}},
		{a, events.PhaseReady, &events.ForwardClosed{ForwardID: "f1"}},
		{a, events.PhaseReady, &events.Active{Source: events.ActiveForward, At: time.Date(2026, 12, 6, 12, 0, 0, 123456789, time.UTC)}},
		{c, events.PhaseReady, &events.Active{Source: events.ActiveTouch}},
		{b, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{b, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "rb"}},
		{b, events.PhaseStarting, &events.ResumeRequested{Generation: 2, RestoreRef: "rb", RestartIfRestoreFails: true}},
		{b, events.PhaseStarting, &events.RetainedStateConsumed{Generation: 2, RestoreRef: "rb"}},
		{b, events.PhaseStarting, &events.StartRequested{Generation: 3, Fallback: true}},
		{b, events.PhaseStarting, &events.Started{Generation: 3, CredentialHash: "h"}},
		{b, events.PhaseError, &events.Exited{Generation: 3, Code: 3}},
		{c, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		{c, events.PhaseError, &events.ResourceLost{Generation: 1}},
		{d, events.PhaseProvisioning, &events.Created{Name: "d", Driver: "sim", Node: "n1", Labels: map[string]string{"team": "x"}, Generation: 1}},
		{d, events.PhaseError, &events.DeadlinePassed{Deadline: "2m"}},
		{d, events.PhaseDeleting, &events.DeleteRequested{}},
		{d, events.PhaseDeleted, &events.Deleted{}},
		{a, events.PhaseSuspending, &events.SuspendRequested{Generation: 2}},
		{a, events.PhaseSuspended, &events.Suspended{Generation: 2, RestoreRef: "r2"}},
		{a, events.PhaseStarting, &events.ResumeRequested{Generation: 3, RestoreRef: "r2"}},
		{a, events.PhaseStarting, &events.RetainedStateConsumed{Generation: 3, RestoreRef: "r2"}},
		{a, events.PhaseStopped, &events.Stopped{Generation: 3, Reason: events.ReasonRetainedStateLost}},
		{a, events.PhaseStarting, &events.StartRequested{Generation: 4}},
		{a, events.PhaseError, &events.StartFailed{Generation: 4, Message: "no"}},
	}
}

// randomScript is n events over up to sandboxes sandboxes, each starting
// with sandbox.created and going on at random with events the lifecycle
// table takes.
func randomScript(t testing.TB, seed uint64, sandboxes, n int) []ev {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	ids := make([]string, sandboxes)
	gens := make([]int64, sandboxes)
	steps := []func(g int64) (events.Phase, events.Event){
		func(g int64) (events.Phase, events.Event) {
			return events.PhaseStarting, &events.StartRequested{Generation: g, Fallback: r.IntN(4) == 0}
		},
		func(g int64) (events.Phase, events.Event) {
			return events.PhaseReady, &events.Started{Generation: g, CredentialHash: "h"}
		},
		func(g int64) (events.Phase, events.Event) {
			return events.PhaseStopped, &events.Stopped{Generation: g, Reason: []string{"", events.ReasonMainProcessExited}[r.IntN(2)]}
		},
		func(g int64) (events.Phase, events.Event) {
			return events.PhaseSuspended, &events.Suspended{Generation: g, RestoreRef: "r", Bytes: int64(r.IntN(3)) * 1000}
		},
		func(g int64) (events.Phase, events.Event) {
			return events.PhaseReady, &events.SuspendRejected{Generation: g, Reason: []string{"", events.ReasonDeadlineExceeded}[r.IntN(2)]}
		},
		func(g int64) (events.Phase, events.Event) {
			return events.PhaseStarting, &events.RetainedStateConsumed{Generation: g, Node: []string{"", "n2"}[r.IntN(2)]}
		},
		func(g int64) (events.Phase, events.Event) {
			return events.PhaseReady, &events.Resumed{Generation: g, Outcome: events.OutcomeRestored}
		},
		func(g int64) (events.Phase, events.Event) {
			return events.PhaseError, &events.Exited{Generation: g, Code: r.IntN(3)}
		},
		func(int64) (events.Phase, events.Event) {
			return events.PhaseReady, &events.ForwardOpened{ForwardID: fmt.Sprint("f", r.IntN(3)), Address: "127.0.0.1:1", Port: 80}
		},
		func(int64) (events.Phase, events.Event) {
			return events.PhaseReady, &events.ForwardClosed{ForwardID: fmt.Sprint("f", r.IntN(3))}
		},
		func(int64) (events.Phase, events.Event) { return events.PhaseDeleted, &events.Deleted{} },
	}
	var out []ev
	phases := make([]events.Phase, sandboxes)
	for len(out) < n {
		i := r.IntN(sandboxes)
		if ids[i] == "" {
			ids[i], gens[i], phases[i] = newID(t), 1, events.PhaseProvisioning
			out = append(out, ev{ids[i], events.PhaseProvisioning, &events.Created{Name: fmt.Sprint("box-", i), Driver: "sim",
				Node: "n1", Labels: map[string]string{"team": fmt.Sprint(i % 3)}, Generation: 1}})
			continue
		}
		if phases[i] == events.PhaseSuspended && r.IntN(3) == 0 {
			gens[i]++
			phases[i] = events.PhaseStarting
			out = append(out, ev{ids[i], events.PhaseStarting, &events.ResumeRequested{Generation: gens[i], RestoreRef: "r"}})
			continue
		}
		// The next event is one the table takes in the sandbox's phase.
		for try := 0; try < 20; try++ {
			_, e := steps[r.IntN(len(steps))](gens[i])
			if to, err := events.Next(phases[i], e.Type()); err == nil {
				phases[i] = to
				out = append(out, ev{ids[i], to, e})
				break
			}
		}
	}
	return out
}

// logOf appends envs to a fresh JetStream log, one append per event with
// the expected last sequence of its sandbox, and returns the store; the
// events land at sequences 1 to len(envs), as envs say.
func logOf(t testing.TB, envs []events.Envelope) *jsstore.Store {
	t.Helper()
	ctx := context.Background()
	store, err := jsstore.New(ctx, natstest.Start(t).JS, jsstore.Config{})
	if err != nil {
		t.Fatalf("store: %v", err)
	}
	last := map[string]uint64{}
	for _, env := range envs {
		seq, err := store.Append(ctx, env.SandboxID, last[env.SandboxID], env)
		if err != nil {
			t.Fatalf("append %s seq %d: %v", env.Type, env.Seq, err)
		}
		if seq != env.Seq {
			t.Fatalf("%s stored at %d, want %d", env.Type, seq, env.Seq)
		}
		last[env.SandboxID] = seq
	}
	return store
}
