package sagas_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/sim"
)

// envSpy is the sim driver, telling the env each start is given.
type envSpy struct {
	*sim.Driver
	got chan map[string]string
}

func (d envSpy) Start(ctx context.Context, req compute.Start) error {
	d.got <- req.Spec.Env
	return d.Driver.Start(ctx, req)
}

// TestStartOpensTheEnv: the log holds env values sealed (the names with
// "(secret)"), and the driver that starts the workload gets them opened; an
// event from before sealing starts with its env as it is; a seal that does
// not open for the sandbox (copied from another) fails the start, and no
// workload starts with redacted values.
func TestStartOpensTheEnv(t *testing.T) {
	want := map[string]string{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI", "A": "1"}
	cases := []struct {
		name    string
		created func(h *harness, id string) *events.Created
		started bool
	}{
		{"sealed", func(h *harness, id string) *events.Created {
			red, sealed, err := h.creds.SealEnv(id, want)
			if err != nil {
				t.Fatal(err)
			}
			return &events.Created{Name: "sb", Driver: "sim", Node: node, Env: red, EnvSealed: sealed, Generation: 1}
		}, true},
		{"in clear, from before", func(h *harness, id string) *events.Created {
			return &events.Created{Name: "sb", Driver: "sim", Node: node, Env: maps.Clone(want), Generation: 1}
		}, true},
		{"sealed for another sandbox", func(h *harness, id string) *events.Created {
			red, sealed, err := h.creds.SealEnv(uuid.NewString(), want)
			if err != nil {
				t.Fatal(err)
			}
			return &events.Created{Name: "sb", Driver: "sim", Node: node, Env: red, EnvSealed: sealed, Generation: 1}
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, sagas.Config{})
			spy := envSpy{Driver: h.sim, got: make(chan map[string]string, 4)}
			h.run(spy)
			sb := &sandbox{h: h, id: uuid.Must(uuid.NewV7()).String()}
			intent := sb.when(tc.created(h, sb.id))
			out := sb.outcome(intent, 1)
			if !tc.started {
				if _, ok := out[0].(*events.StartFailed); !ok {
					t.Fatalf("outcome %T, want a failed start", out[0])
				}
				if len(spy.got) != 0 {
					t.Fatalf("the driver was asked to start with env %v", <-spy.got)
				}
				return
			}
			select {
			case got := <-spy.got:
				if !maps.Equal(got, want) {
					t.Fatalf("the driver got env %v, want %v", got, want)
				}
			case <-time.After(wait):
				t.Fatal("no start")
			}
		})
	}
}

// TestColdFallbackWithAnUnopenableEnv: a resume that may fall back to a
// cold start, of a sandbox whose env seal does not open here (the key that
// sealed it is gone), never starts the workload with the redacted
// "(secret)" values. A fresh resume is refused before the retained state is
// touched: resume_failed saying why, suspended again (retryable, without
// the fallback). A resume whose retained state was consumed already (a
// re-driven one) and whose restore fails ends as a strict one: stopped,
// RetainedStateLost, no fallback start.
func TestColdFallbackWithAnUnopenableEnv(t *testing.T) {
	env := map[string]string{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}
	setup := func(t *testing.T) (*harness, *sandbox, string, envSpy) {
		h := newHarness(t, sagas.Config{})
		sb := &sandbox{h: h, id: uuid.Must(uuid.NewV7()).String()}
		other, err := compute.NewCredentials([]byte("another service's secret, gone.."))
		if err != nil {
			t.Fatal(err)
		}
		red, sealed, err := other.SealEnv(sb.id, env)
		if err != nil {
			t.Fatal(err)
		}
		opts := map[string]string{"resume": "fail_after_consume"}
		sb.given(&events.Created{Name: "sb", Driver: "sim", Node: node, DriverOptions: opts, Env: red, EnvSealed: sealed, Generation: 1})
		spec := compute.Spec{SandboxID: sb.id, Node: node, Options: opts}
		if err := h.sim.Start(context.Background(), compute.Start{Spec: spec, Generation: 1, Credential: h.creds.Mint(sb.id, 1)}); err != nil {
			t.Fatalf("sim start: %v", err)
		}
		sb.given(&events.Started{Generation: 1}, &events.SupervisorAttached{Generation: 1})
		ref, err := h.sim.Suspend(context.Background(), compute.Target{Spec: spec, Generation: 1})
		if err != nil {
			t.Fatalf("sim suspend: %v", err)
		}
		sb.given(&events.SuspendRequested{Generation: 1}, &events.Suspended{Generation: 1, RestoreRef: ref})
		spy := envSpy{Driver: h.sim, got: make(chan map[string]string, 4)}
		return h, sb, ref, spy
	}
	noStart := func(t *testing.T, h *harness, sb *sandbox, spy envSpy, want events.Phase) {
		t.Helper()
		all, err := h.store.Load(context.Background(), sb.id, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range all {
			if e.Type == events.TypeStartRequested || e.Type == events.TypeStarted && e.Seq > sb.intent.Seq {
				t.Errorf("%s recorded: no cold start can be made without the env", e.Type)
			}
		}
		if got := all[len(all)-1].Phase; got != want {
			t.Errorf("phase %s after the resume, want %s", got, want)
		}
		if len(spy.got) != 0 {
			t.Fatalf("the driver was asked to start with env %v", <-spy.got)
		}
	}

	t.Run("a fresh resume is refused, the state kept", func(t *testing.T) {
		h, sb, ref, spy := setup(t)
		h.run(spy)
		in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, RestartIfRestoreFails: true})
		out := sb.outcome(in, 1)
		sb.then(out, &events.ResumeFailed{Generation: 2})
		if msg := out[0].(*events.ResumeFailed).Message; !strings.Contains(msg, "no longer holds") {
			t.Errorf("resume_failed message %q: want it to say the env's key is gone", msg)
		}
		noStart(t, h, sb, spy, events.PhaseSuspended)
		// A strict resume needs no env: it is not refused, and goes to the
		// driver (whose restore this sim fails after consuming the state).
		strict := sb.when(&events.ResumeRequested{Generation: 3, RestoreRef: ref})
		sb.then(sb.outcome(strict, 2), &events.RetainedStateConsumed{Generation: 3, RestoreRef: ref}, &events.Stopped{Generation: 3, Reason: events.ReasonRetainedStateLost})
	})
	t.Run("a consumed state, restore failed: stopped, no fallback", func(t *testing.T) {
		h, sb, ref, spy := setup(t)
		in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, RestartIfRestoreFails: true})
		// The resume ran before a restart: the driver consumed the state and
		// the consumption is recorded, the outcome is not.
		if _, err := h.sim.Resume(context.Background(), compute.Resume{Spec: compute.Spec{SandboxID: sb.id, Node: node, Options: map[string]string{"resume": "fail_after_consume"}}, Generation: 2, Credential: h.creds.Mint(sb.id, 2), RestoreRef: ref}); err == nil {
			t.Fatal("the sim restored a fail_after_consume resume")
		}
		sb.given(&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref})
		h.run(spy)
		var outcome events.Envelope
		h.store.waitUntil(t, "the resume's outcome", func() bool {
			for _, e := range sb.causedBy(in) {
				if e.Type != events.TypeRetainedStateConsumed {
					outcome = e
					return true
				}
			}
			return false
		})
		got, err := outcome.Decode()
		if err != nil {
			t.Fatal(err)
		}
		sb.then([]events.Event{got}, &events.Stopped{Generation: 2, Reason: events.ReasonRetainedStateLost})
		noStart(t, h, sb, spy, events.PhaseStopped)
	})
}
