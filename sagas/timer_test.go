package sagas_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	"github.com/torpor/torpor/sagas"
)

// timerExpands is gatewayExpands, and an idle timeout comes with the
// suspend it starts, as the gateway appends it (gateway/idle.go).
func timerExpands(e events.Event) []events.Event {
	if it, ok := e.(*events.IdleTimeout); ok {
		return []events.Event{it, &events.SuspendRequested{Generation: 1}}
	}
	return gatewayExpands(e)
}

// waitType waits for sb's first event of type typ and returns it.
func (sb *sandbox) waitType(typ string) events.Envelope {
	sb.h.t.Helper()
	var found events.Envelope
	sb.h.store.waitUntil(sb.h.t, typ+" of "+sb.id, func() bool {
		all, err := sb.h.store.Load(context.Background(), sb.id, 0)
		if err != nil {
			sb.h.t.Fatal(err)
		}
		i := slices.IndexFunc(all, func(e events.Envelope) bool { return e.Type == typ })
		if i >= 0 {
			found = all[i]
		}
		return i >= 0
	})
	return found
}

// count is how many events of type typ sb's log holds.
func (sb *sandbox) count(typ string) int {
	sb.h.t.Helper()
	all, err := sb.h.store.Load(context.Background(), sb.id, 0)
	if err != nil {
		sb.h.t.Fatal(err)
	}
	n := 0
	for _, e := range all {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// TestLongTimersAfterARestart: with a record of its timers, the runner's
// saved position passes the event that armed a long timer (a ttl, an idle
// policy), so a restart does not read the log again from there; the timer
// that came due while no runner ran fires once, at the next start, and
// leaves the record. (Broken on purpose: with the kept timers holding the
// floor, the position never passes the create.)
func TestLongTimersAfterARestart(t *testing.T) {
	cases := []struct {
		kind      string
		created   func() *events.Created
		suspended bool   // suspended after ready, else ready
		fired     string // the event the timer's decision appends
	}{
		{"ttl", func() *events.Created {
			return &events.Created{ExpiresAt: time.Now().Add(time.Second).UTC(), OnExpiry: events.OnExpiryStop}
		}, false, events.TypeExpired},
		{"idle", func() *events.Created {
			return &events.Created{Idle: events.IdlePolicy{After: "1s", Action: events.IdleSuspend}}
		}, false, events.TypeIdleTimeout},
		{"retention", func() *events.Created { return &events.Created{RetainFor: "1s"} }, true, events.TypeExpired},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			tm := newTimers()
			h := newHarness(t, sagas.Config{Timers: tm})
			h.rec.expand = timerExpands
			var sb *sandbox
			if c.suspended {
				sb, _ = h.suspendedWith(c.created())
			} else {
				sb = h.readyWith(c.created())
			}
			due := time.Now().Add(time.Second)
			last, err := h.store.LastSeq(context.Background()) // the event that armed the timer, or before it
			if err != nil {
				t.Fatal(err)
			}
			stop := h.run(h.sim)
			h.store.waitPast(t, last)
			key := sagas.TimerKey(sb.id, c.kind)
			if !tm.has(key) {
				t.Fatalf("the position passed %d, but the record lacks %s", last, key)
			}
			stop()
			if n := h.rec.callsOf(c.fired); n != 0 {
				t.Fatalf("the first runner recorded %d %s before its time", n, c.fired)
			}
			from := h.store.saved()
			time.Sleep(time.Until(due)) // the service is down when the timer comes due
			stop = h.run(h.sim)
			sb.waitType(c.fired)
			stop()
			if n := sb.count(c.fired); n != 1 {
				t.Fatalf("%d %s in the log, want 1", n, c.fired)
			}
			if from < last {
				t.Fatalf("the restarted runner read the log from %d, before %d", from, last)
			}
			if tm.has(key) {
				t.Fatalf("%s still in the record after it fired", key)
			}
		})
	}
}

// TestTimersFireCommandsOfTheirOwn: what a timer decides is a command of
// its own, caused by the event that armed it. An idle timer armed by
// activity that carries no command (a touch) records its idle timeout and
// the suspend it starts under a command id, which the suspend's outcome
// answers; a ttl refused once fires again under the same command id,
// not the create's.
func TestTimersFireCommandsOfTheirOwn(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		h := newHarness(t, sagas.Config{})
		h.rec.expand = timerExpands
		sb := h.readyWith(&events.Created{Idle: events.IdlePolicy{After: "300ms", Action: events.IdleSuspend}})
		touch, err := events.NewEnvelope(sb.id, &events.Active{Source: events.ActiveTouch}, events.Meta{Actor: "test"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		envs, err := h.store.appendNext(context.Background(), sb.id, false, touch)
		if err != nil {
			t.Fatal(err)
		}
		touch = envs[0]
		h.run(h.sim)
		idle := sb.waitType(events.TypeIdleTimeout)
		suspended := sb.waitType(events.TypeSuspended)
		all, err := h.store.Load(context.Background(), sb.id, idle.Seq-1)
		if err != nil {
			t.Fatal(err)
		}
		asked := all[1] // appended with the idle timeout
		switch {
		case idle.CommandID == "":
			t.Fatalf("idle timeout with no command id")
		case idle.CausationID != touch.ID:
			t.Fatalf("idle timeout caused by %s, want the touch %s that armed it", idle.CausationID, touch.ID)
		case asked.Type != events.TypeSuspendRequested || asked.CommandID != idle.CommandID:
			t.Fatalf("after the idle timeout: %s of command %q, want the suspend it starts, of %q", asked.Type, asked.CommandID, idle.CommandID)
		case suspended.CommandID != idle.CommandID:
			t.Fatalf("suspended answers command %q, want the idle timeout's %q", suspended.CommandID, idle.CommandID)
		}
	})
	t.Run("ttl", func(t *testing.T) {
		h := newHarness(t, sagas.Config{})
		h.rec.expand = timerExpands
		refused := false
		h.rec.refuse = func(e events.Event) bool {
			if _, ok := e.(*events.Expired); ok && !refused {
				refused = true
				return true
			}
			return false
		}
		sb := h.readyWith(&events.Created{ExpiresAt: time.Now().Add(expiryTTL).UTC(), OnExpiry: events.OnExpiryStop})
		created := sb.intent
		h.run(h.sim)
		env, _ := sb.waitExpired()
		h.rec.mu.Lock()
		var commands []string
		for i, c := range h.rec.calls {
			if c[0] == events.TypeExpired {
				commands = append(commands, h.rec.causes[i].CommandID)
			}
		}
		h.rec.mu.Unlock()
		switch {
		case len(commands) != 2:
			t.Fatalf("%d expiries reported, want 2 (one refused)", len(commands))
		case commands[0] != commands[1]:
			t.Fatalf("the expiry fired again as command %s, then %s: want one command", commands[0], commands[1])
		case env.CommandID != commands[0] || env.CommandID == "" || env.CommandID == created.CommandID:
			t.Fatalf("expired of command %q, reported as %q, create's %q: want a command of its own", env.CommandID, commands[0], created.CommandID)
		case env.CausationID != created.ID:
			t.Fatalf("expired caused by %s, want the create %s that armed it", env.CausationID, created.ID)
		}
	})
}

// TestParkedTTLMeetsItsLeaving: a ttl paused while suspended is parked by
// its job after it read the log up to its suspension; an event that leaves
// suspended read by the runner between that read and the park (driven
// here: the job's read is held until the runner took the event) must not
// leave it parked for good: it fires at the time its stay moved it to.
// (Broken on purpose: without park's look at what was read since, the
// ttl stays parked and never fires.)
func TestParkedTTLMeetsItsLeaving(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	h.rec.expand = func(e events.Event) []events.Event { return nil } // stopped: the expiry alone
	at := time.Now().Add(expiryTTL).UTC()
	sb, ref := h.suspendedWith(&events.Created{ExpiresAt: at, OnExpiry: events.OnExpiryStop, TTLPausesWhileSuspended: true})
	held := make(chan struct{})
	h.store.onLoad(func(id string, log []events.Envelope) {
		if id != sb.id || time.Now().Before(at) || log[len(log)-1].Type != events.TypeSuspended {
			return
		}
		select {
		case <-held:
			return // once
		default:
			close(held)
		}
		// The job read the log to its suspension; the sandbox leaves
		// suspended, and the runner reads it, before the job goes on.
		env, err := events.NewEnvelope(sb.id, &events.RetainedStateInvalidated{RestoreRef: ref, Reason: events.ReasonRetainedStateLost}, events.Meta{Actor: "test"}, time.Now())
		if err != nil {
			t.Error(err)
			return
		}
		envs, err := h.store.appendNext(context.Background(), sb.id, false, env)
		if err != nil {
			t.Error(err)
			return
		}
		// Forged: only an expiry invalidates a suspended sandbox's state
		// (the test wants an event that leaves suspended and starts no
		// saga, whose events would unpark the ttl anyway).
		h.expect(func(v check.Violation) bool { return v.SandboxID == sb.id && v.Seq == envs[0].Seq })
		timeout := time.After(wait)
		for {
			h.store.mu.Lock()
			ch := h.store.changed
			h.store.mu.Unlock()
			if h.store.followed() >= envs[0].Seq {
				return
			}
			select {
			case <-ch:
			case <-timeout:
				t.Error("the runner never read the event that leaves suspended")
				return
			}
		}
	})
	h.run(h.sim)
	env, got := sb.waitExpired()
	select {
	case <-held:
	default:
		t.Fatal("the ttl's job never read the log while suspended")
	}
	if got.Policy != events.ExpiryTTL || !got.ExpiresAt.After(at) || env.Time.Before(got.ExpiresAt) {
		t.Fatalf("expired %+v at %s; want the ttl moved past %s by the stay, fired no earlier", got, env.Time, at)
	}
}

// TestStaleTimerLeavesTheRecord: a key of the record whose sandbox has no
// such timer any more (its ttl spent while the record was not told) is
// armed at start, found to have nothing to do, and deleted from the
// record; nothing is recorded. (Broken on purpose: keep deleting nothing,
// the key stays.)
func TestStaleTimerLeavesTheRecord(t *testing.T) {
	tm := newTimers()
	h := newHarness(t, sagas.Config{Timers: tm})
	tm.notify = h.store.notify
	sb := h.ready(nil) // no ttl
	key := sagas.TimerKey(sb.id, "ttl")
	if err := tm.Put(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	h.run(h.sim)
	h.store.waitUntil(t, "the stale key deleted", func() bool { return !tm.has(key) })
	if n := h.rec.callsOf(events.TypeExpired); n != 0 {
		t.Fatalf("%d expiries reported for a sandbox without a ttl", n)
	}
}

// TestFenceKeepsTheRecord: while Config.Fence refuses (the runner lost its
// node's lease), the runner changes nothing in the record of its timers: a
// ttl disarmed meanwhile (its sandbox deleting) stays there; once the fence
// allows, it is deleted. (Broken on purpose: the record not fenced, the key
// is deleted behind the refusing fence.)
func TestFenceKeepsTheRecord(t *testing.T) {
	fence := newLossyFence(false)
	tm := newTimers()
	h := newHarness(t, sagas.Config{Fence: fence.check, Timers: tm})
	tm.notify = h.store.notify
	sb := h.readyWith(&events.Created{ExpiresAt: time.Now().Add(time.Hour).UTC(), OnExpiry: events.OnExpiryStop})
	key := sagas.TimerKey(sb.id, "ttl")
	h.run(h.sim)
	h.store.waitUntil(t, key+" in the record", func() bool { return tm.has(key) })
	fence.set(true)
	sb.when(&events.DeleteRequested{}) // disarms the ttl
	fence.waitRefused(t)
	if !tm.has(key) {
		t.Fatalf("%s deleted from the record behind a refusing fence", key)
	}
	fence.set(false)
	h.store.waitUntil(t, key+" deleted from the record", func() bool { return !tm.has(key) })
}

// TestLongTimerRebuiltBeforeItsTime: a ttl kept in the record and not yet
// due when the runner starts again is armed from the record at once, and
// its job, reading the log, waits for its time: it fires once, not before.
// (Broken on purpose: the job not waiting for the ttl's time, it fires at
// the start.)
func TestLongTimerRebuiltBeforeItsTime(t *testing.T) {
	tm := newTimers()
	h := newHarness(t, sagas.Config{Timers: tm})
	h.rec.expand = timerExpands
	at := time.Now().Add(time.Second).UTC()
	sb := h.readyWith(&events.Created{ExpiresAt: at, OnExpiry: events.OnExpiryStop})
	last := sb.intent.Seq + 2
	stop := h.run(h.sim)
	h.store.waitPast(t, last)
	stop()
	if !tm.has(sagas.TimerKey(sb.id, "ttl")) {
		t.Fatal("the ttl is not in the record")
	}
	h.run(h.sim) // reads nothing before the create: the ttl comes from the record
	env, got := sb.waitExpired()
	if env.Time.Before(at) || !got.ExpiresAt.Equal(at) {
		t.Fatalf("expired %+v at %s; want the ttl at %s, not before", got, env.Time, at)
	}
	if n := sb.count(events.TypeExpired); n != 1 {
		t.Fatalf("%d expiries, want 1", n)
	}
}
