package kvview

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections"
)

var _ projections.Projection = (*View)(nil)
var _ projections.Checkpointer = (*View)(nil)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func newView(t *testing.T, js jetstream.JetStream) *View {
	t.Helper()
	v, err := New(context.Background(), js, Config{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

func newID(t *testing.T) string {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatalf("uuid: %v", err)
	}
	return id.String()
}

// env builds the envelope of e for sandbox id as the store would deliver it.
func env(t *testing.T, id string, seq uint64, phase events.Phase, e events.Event) events.Envelope {
	t.Helper()
	en, err := events.NewEnvelope(id, e, events.Meta{Actor: "test"}, t0.Add(time.Duration(seq)*time.Second))
	if err != nil {
		t.Fatalf("envelope: %v", err)
	}
	en.Seq, en.Phase = seq, phase
	return en
}

func apply(t *testing.T, v *View, envs ...events.Envelope) {
	t.Helper()
	for _, e := range envs {
		if err := v.Apply(context.Background(), e); err != nil {
			t.Fatalf("Apply %s seq %d: %v", e.Type, e.Seq, err)
		}
	}
}

func get(t *testing.T, v *View, id string) events.View {
	t.Helper()
	got, err := v.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return got
}

// sameView compares views by their wire form (CONTRACT §6).
func sameView(t *testing.T, got, want events.View) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("view:\n got %s\nwant %s", g, w)
	}
}

func created(id string, labels map[string]string) events.Event {
	return &events.Created{Name: "box-" + id[len(id)-4:], Driver: "sim", Node: "n1", Labels: labels, Generation: 1}
}

func TestApplyLifecycle(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	want := events.View{ID: id, Name: "box-" + id[len(id)-4:], Driver: "sim", Node: "n1",
		Labels: map[string]string{"team": "a"}, Generation: 1}
	steps := []struct {
		name  string
		seq   uint64
		phase events.Phase
		e     events.Event
		edit  func(*events.View)
	}{
		{"created", 1, events.PhaseProvisioning, created(id, map[string]string{"team": "a"}), func(w *events.View) {
			w.LastActiveAt = t0.Add(time.Second) // a command's event: activity
		}},
		{"attached", 3, events.PhaseReady, &events.SupervisorAttached{Generation: 1}, func(*events.View) {}},
		{"suspend requested", 4, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}, func(w *events.View) {
			w.LastActiveAt = t0.Add(4 * time.Second)
		}},
		{"suspended", 7, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "r1"}, func(w *events.View) {
			w.Restore = events.Restore{Held: true, RestoreRef: "r1"}
		}},
		{"resume requested", 8, events.PhaseStarting, &events.ResumeRequested{Generation: 2, RestoreRef: "r1"}, func(w *events.View) {
			w.Generation, w.LastActiveAt = 2, t0.Add(8*time.Second)
		}},
		{"retained state consumed", 9, events.PhaseStarting, &events.RetainedStateConsumed{Generation: 2, RestoreRef: "r1"}, func(w *events.View) {
			w.Restore = events.Restore{Consumed: true}
		}},
		{"resumed", 11, events.PhaseStarting, &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored}, func(w *events.View) {
			w.LastOutcome = events.OutcomeRestored
		}},
		{"attached again", 12, events.PhaseReady, &events.SupervisorAttached{Generation: 2}, func(*events.View) {}},
	}
	for _, s := range steps {
		apply(t, v, env(t, id, s.seq, s.phase, s.e))
		s.edit(&want)
		if s.phase != want.Phase { // phase_since: when it entered its phase
			want.PhaseSince = t0.Add(time.Duration(s.seq) * time.Second)
		}
		want.Phase, want.Seq, want.UpdatedAt = s.phase, s.seq, t0.Add(time.Duration(s.seq)*time.Second)
		got := get(t, v, id)
		t.Logf("after %s", s.name)
		sameView(t, got, want)
	}
}

func revision(t *testing.T, v *View, id string) uint64 {
	t.Helper()
	e, err := v.kv.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("kv get %s: %v", id, err)
	}
	return e.Revision()
}

func TestApplyNeverGoesBack(t *testing.T) {
	js := natstest.Start(t).JS
	v := newView(t, js)
	id := newID(t)
	first := env(t, id, 5, events.PhaseProvisioning, created(id, nil))
	apply(t, v, first)
	want := get(t, v, id)
	rev := revision(t, v, id)

	stale := []events.Envelope{
		first, // redelivered
		env(t, id, 3, events.PhaseError, &events.Exited{Generation: 1, Code: 2}),    // older
		env(t, id, 5, events.PhaseReady, &events.SupervisorAttached{Generation: 1}), // same seq
	}
	apply(t, v, stale...)
	sameView(t, get(t, v, id), want)
	if got := revision(t, v, id); got != rev {
		t.Errorf("revision = %d after ignored events, want %d (no write)", got, rev)
	}

	noSeq := env(t, id, 0, events.PhaseReady, &events.SupervisorAttached{Generation: 1})
	if err := v.Apply(context.Background(), noSeq); err == nil {
		t.Error("Apply without a seq = nil, want an error")
	}
	sameView(t, get(t, v, id), want)

	// A writer with an empty cache reads the view back and ignores them too.
	apply(t, newView(t, js), stale...)
	sameView(t, get(t, v, id), want)
}

func TestApplySkipsUnknownType(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	apply(t, v, env(t, id, 1, events.PhaseProvisioning, created(id, nil)))
	want := get(t, v, id)

	unknown := env(t, id, 2, events.PhaseStopped, &events.Deleted{})
	unknown.Type = "sandbox.from_the_future"
	apply(t, v, unknown)
	sameView(t, get(t, v, id), want)

	apply(t, v, env(t, id, 3, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	got := get(t, v, id)
	if got.Phase != events.PhaseReady || got.Seq != 3 {
		t.Errorf("after the next known event: phase %q seq %d, want ready 3", got.Phase, got.Seq)
	}
}

func TestConcurrentWriters(t *testing.T) {
	js := natstest.Start(t).JS
	a, b := newView(t, js), newView(t, js)
	id := newID(t)
	apply(t, a, env(t, id, 1, events.PhaseProvisioning, created(id, nil)))
	apply(t, b, env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	// a's cached revision is stale now: its write must reload and fold again.
	apply(t, a, env(t, id, 3, events.PhaseStopping, &events.StopRequested{}))
	apply(t, b, env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	got := get(t, a, id)
	if got.Phase != events.PhaseStopping || got.Seq != 3 {
		t.Errorf("phase %q seq %d, want stopping 3", got.Phase, got.Seq)
	}
}

func TestGetNotFound(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	for _, id := range []string{newID(t), "a.*", ""} {
		_, err := v.Get(context.Background(), id)
		if !errors.Is(err, events.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want ErrNotFound", id, err)
		}
	}
}

func TestRestartContinuesFromBucket(t *testing.T) {
	js := natstest.Start(t).JS
	v := newView(t, js)
	id := newID(t)
	apply(t, v,
		env(t, id, 1, events.PhaseProvisioning, created(id, map[string]string{"k": "v"})),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
	)

	w := newView(t, js)
	cp, err := w.Checkpoint(context.Background())
	if err != nil || cp != 2 {
		t.Errorf("Checkpoint = %d, %v; want 2", cp, err)
	}
	apply(t, w, env(t, id, 4, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}))
	got := get(t, w, id)
	if got.Phase != events.PhaseSuspending || got.Seq != 4 || got.Labels["k"] != "v" || got.Name == "" {
		t.Errorf("after restart: %+v, want suspending at 4 with name and labels kept", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Replicas: -1}, {Replicas: 7}, {CacheSize: -1}, {Bucket: "a b"}} {
		if c.Validate() == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("Validate(zero) = %v", err)
	}
}
