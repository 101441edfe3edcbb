package sagas_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
)

// expiryTTL is the short time to live and retention of these tests: the
// scheduler runs on real time.
const expiryTTL = 300 * time.Millisecond

// readyWith is h.ready with c as the sandbox's created event.
func (h *harness) readyWith(c *events.Created) *sandbox {
	h.t.Helper()
	sb := &sandbox{h: h, id: uuid.Must(uuid.NewV7()).String()}
	c.Name, c.Driver, c.Node, c.Generation = "sb", "sim", node, 1
	sb.when(c)
	spec := compute.Spec{SandboxID: sb.id, Node: node}
	if err := h.sim.Start(context.Background(), compute.Start{Spec: spec, Generation: 1, Credential: h.creds.Mint(sb.id, 1)}); err != nil {
		h.t.Fatalf("sim start: %v", err)
	}
	sb.given(&events.Started{Generation: 1}, &events.SupervisorAttached{Generation: 1})
	return sb
}

// suspendedWith is h.suspended with c as the sandbox's created event.
func (h *harness) suspendedWith(c *events.Created) (*sandbox, string) {
	h.t.Helper()
	sb := h.readyWith(c)
	ref, err := h.sim.Suspend(context.Background(), compute.Target{Spec: compute.Spec{SandboxID: sb.id, Node: node}, Generation: 1})
	if err != nil {
		h.t.Fatalf("sim suspend: %v", err)
	}
	sb.given(&events.SuspendRequested{Generation: 1}, &events.Suspended{Generation: 1, RestoreRef: ref})
	return sb, ref
}

// expiries returns the sandbox.expired events of sb's log with their
// envelopes.
func (sb *sandbox) expiries() ([]events.Envelope, []*events.Expired) {
	sb.h.t.Helper()
	all, err := sb.h.store.Load(context.Background(), sb.id, 0)
	if err != nil {
		sb.h.t.Fatal(err)
	}
	var envs []events.Envelope
	var out []*events.Expired
	for _, env := range all {
		if env.Type != events.TypeExpired {
			continue
		}
		e, err := env.Decode()
		if err != nil {
			sb.h.t.Fatal(err)
		}
		envs, out = append(envs, env), append(out, e.(*events.Expired))
	}
	return envs, out
}

// waitExpired waits for sb's first expiry and returns it.
func (sb *sandbox) waitExpired() (events.Envelope, *events.Expired) {
	sb.h.t.Helper()
	sb.h.store.waitUntil(sb.h.t, "an expiry of "+sb.id, func() bool {
		envs, _ := sb.expiries()
		return len(envs) > 0
	})
	envs, evs := sb.expiries()
	return envs[0], evs[0]
}

// gatewayExpands is what the gateway appends with an expiry (its action's
// start; gateway/expiry.go), for the recorder of these tests.
func gatewayExpands(e events.Event) []events.Event {
	x, ok := e.(*events.Expired)
	if !ok {
		return nil
	}
	switch {
	case x.Policy == events.ExpiryRetention:
		return []events.Event{x, &events.RetainedStateInvalidated{RestoreRef: x.RestoreRef, Reason: events.ReasonExpired}}
	case x.Action == events.OnExpiryStop:
		return []events.Event{x, &events.StopRequested{Generation: 1}}
	}
	return []events.Event{x, &events.DeleteRequested{}}
}

// TestTTLExpiresOnTime: a sandbox created with an expires_at gets its
// expiry recorded at that time, not before, naming the policy and the
// action, and the action's own saga runs: a delete deletes it, a stop
// stops it.
func TestTTLExpiresOnTime(t *testing.T) {
	cases := []struct {
		on   string
		then string // the event the action's saga records
	}{
		{events.OnExpiryDelete, events.TypeDeleted},
		{events.OnExpiryStop, events.TypeStopped},
	}
	for _, c := range cases {
		t.Run(c.on, func(t *testing.T) {
			h := newHarness(t, sagas.Config{})
			h.rec.expand = gatewayExpands
			at := time.Now().Add(expiryTTL).UTC()
			sb := h.readyWith(&events.Created{ExpiresAt: at, OnExpiry: c.on})
			h.run(h.sim)
			env, got := sb.waitExpired()
			if got.Policy != events.ExpiryTTL || !got.ExpiresAt.Equal(at) || got.Action != c.on {
				t.Fatalf("expired %+v; want ttl at %s, action %s", got, at, c.on)
			}
			if env.Time.Before(at) {
				t.Fatalf("expired at %s, before its time %s", env.Time, at)
			}
			h.store.waitUntil(t, c.then, func() bool {
				all, _ := h.store.Load(context.Background(), sb.id, env.Seq)
				for _, e := range all {
					if e.Type == c.then {
						return true
					}
				}
				return false
			})
		})
	}
}

// TestRetentionExpires: a suspended sandbox whose retain_for passed has
// its retained state invalidated (Expired, stopped), and the driver
// releases it: the reference no longer resumes.
func TestRetentionExpires(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	h.rec.expand = gatewayExpands
	drv := newCounting(h.sim, "")
	sb, ref := h.suspendedWith(&events.Created{RetainFor: expiryTTL.String()})
	h.run(drv)
	env, got := sb.waitExpired()
	if got.Policy != events.ExpiryRetention || got.RestoreRef != ref || got.Action != events.OnExpiryStop {
		t.Fatalf("expired %+v; want retention of %s, action stop", got, ref)
	}
	suspendedAt := sb.intent.Time // the suspend's intent, a moment before the suspension
	if env.Time.Sub(suspendedAt) < expiryTTL {
		t.Fatalf("expired %s after the suspension, want %s or more", env.Time.Sub(suspendedAt), expiryTTL)
	}
	h.store.waitPast(t, env.Seq+1) // the release step is done
	if n := drv.count("discard"); n != 1 {
		t.Fatalf("%d discards, want 1", n)
	}
	_, err := h.sim.Resume(context.Background(), compute.Resume{Spec: compute.Spec{SandboxID: sb.id, Node: node}, Generation: 2, RestoreRef: ref})
	if !errors.Is(err, compute.ErrUnknownRef) {
		t.Fatalf("resume of the expired reference: %v, want unknown ref", err)
	}
}

// TestResumedBeforeRetentionEnds: a state consumed before its retention
// ended expires nothing. A witness sandbox suspended after it, whose
// retention ends later, shows the time passed.
func TestResumedBeforeRetentionEnds(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	h.rec.expand = gatewayExpands
	sb, ref := h.suspendedWith(&events.Created{RetainFor: expiryTTL.String()})
	sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.given(&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref}, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored})
	sb.given(&events.SupervisorAttached{Generation: 2})
	witness, _ := h.suspendedWith(&events.Created{RetainFor: (2 * expiryTTL).String()})
	h.run(h.sim)
	witness.waitExpired()
	if envs, _ := sb.expiries(); len(envs) != 0 {
		t.Fatalf("the resumed sandbox expired: %v", envs)
	}
	if n := h.rec.callsOf(events.TypeExpired); n != 1 {
		t.Fatalf("%d expiries reported, want the witness's only", n)
	}
}

// TestExpiryAfterARestart: an expiry that came due while no runner ran is
// fired by the next one, once: the runner's saved position held the event
// that armed it.
func TestExpiryAfterARestart(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	h.rec.expand = gatewayExpands
	at := time.Now().Add(time.Second).UTC()
	sb := h.readyWith(&events.Created{ExpiresAt: at, OnExpiry: events.OnExpiryStop})
	stop := h.run(h.sim)
	last := sb.intent.Seq + 2
	h.store.waitUntil(t, "the runner to read the sandbox", func() bool { return h.store.followed() >= last })
	stop()
	if n := h.rec.callsOf(events.TypeExpired); n != 0 {
		t.Fatalf("the first runner recorded %d expiries before its time", n)
	}
	if h.store.saved() >= sb.intent.Seq {
		t.Fatalf("saved position %d passed the create at %d, which armed the expiry", h.store.saved(), sb.intent.Seq)
	}
	time.Sleep(time.Until(at)) // the service is down when the expiry comes due
	stop = h.run(h.sim)
	sb.waitExpired()
	stop()
	// A third runner, and a witness whose expiry comes after it started.
	// The witness is laid in the log before the runner starts: laid while
	// it ran, its create was answered twice (the runner's started and the
	// harness's), which the checker rightly refuses.
	witness := h.readyWith(&events.Created{ExpiresAt: time.Now().Add(expiryTTL).UTC(), OnExpiry: events.OnExpiryStop})
	h.run(h.sim)
	witness.waitExpired()
	if envs, _ := sb.expiries(); len(envs) != 1 {
		t.Fatalf("%d expiries of the sandbox, want 1", len(envs))
	}
}

// TestRetentionHeldInErrorExpiresNothing: a resume whose deadline ended it
// in error leaves its reference held in the log, for the delete to
// invalidate: its retention has nothing to stop, and is not fired (nor
// tried every second) there. A witness suspended after it shows the time
// passed.
func TestRetentionHeldInErrorExpiresNothing(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	h.rec.expand = gatewayExpands
	sb, ref := h.suspendedWith(&events.Created{RetainFor: expiryTTL.String()})
	sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.given(&events.DeadlinePassed{Phase: events.PhaseStarting, Deadline: "2m0s"}, &events.CleanupRequested{Generation: 2, Action: events.CleanupStop})
	witness, _ := h.suspendedWith(&events.Created{RetainFor: (2 * expiryTTL).String()})
	h.run(h.sim)
	witness.waitExpired()
	if envs, _ := sb.expiries(); len(envs) != 0 {
		t.Fatalf("the sandbox in error expired: %v", envs)
	}
	if n := h.rec.callsOf(events.TypeExpired); n != 1 {
		t.Fatalf("%d expiries reported, want the witness's only", n)
	}
}

// TestTTLFollowsAMovedSandbox: a sandbox of another node whose resume
// moved it to this runner's node expires here, at its ttl.
func TestTTLFollowsAMovedSandbox(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	at := time.Now().Add(expiryTTL).UTC()
	sb := &sandbox{h: h, id: uuid.Must(uuid.NewV7()).String()}
	sb.when(&events.Created{Name: "sb", Driver: "sim", Node: "n0", Generation: 1, ExpiresAt: at, OnExpiry: events.OnExpiryDelete})
	sb.given(&events.Started{Generation: 1}, &events.SupervisorAttached{Generation: 1})
	sb.when(&events.SuspendRequested{Generation: 1})
	sb.given(&events.Suspended{Generation: 1, RestoreRef: "vm:n0:x"})
	sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: "vm:n0:x", Node: node})
	sb.given(&events.RetainedStateConsumed{Generation: 2, RestoreRef: "vm:n0:x", Node: node}, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored})
	sb.given(&events.SupervisorAttached{Generation: 2})
	h.run(h.sim)
	env, got := sb.waitExpired()
	if got.Policy != events.ExpiryTTL || !got.ExpiresAt.Equal(at) || env.Time.Before(at) {
		t.Fatalf("expired %+v at %s; want the ttl at %s", got, env.Time, at)
	}
}
