package events

import (
	"errors"
	"testing"
	"time"
)

// TestFoldMovable: a sandbox.retained_state_exported makes the view say
// the held state is movable, with its size, only while that state is held;
// a stale or forged one (another reference, none held, another phase) is
// passed over and changes nothing; whatever ends the hold clears it.
func TestFoldMovable(t *testing.T) {
	type step struct {
		e    Event
		took bool // false: refused, the view unchanged
	}
	suspended := []step{
		{&Created{Generation: 1}, true},
		{&SupervisorAttached{Generation: 1}, true},
		{&SuspendRequested{Generation: 1}, true},
		{&Suspended{Generation: 1, RestoreRef: "r1", Bytes: 100}, true},
	}
	exported := func(ref string, bytes int64) Event {
		return &RetainedStateExported{RestoreRef: ref, Via: "obj:" + ref, Bytes: bytes}
	}
	cases := []struct {
		name      string
		steps     []step
		movable   bool
		bytes     int64
		phase     Phase
		restoreOf string
	}{
		{"exported while held", append(suspended[:4:4], step{exported("r1", 90), true}), true, 90, PhaseSuspended, "r1"},
		{"another reference", append(suspended[:4:4], step{exported("r0", 90), false}), false, 0, PhaseSuspended, "r1"},
		{"no reference", append(suspended[:4:4], step{exported("", 90), false}), false, 0, PhaseSuspended, "r1"},
		{"before the suspension", append(suspended[:3:3], step{exported("r1", 90), false}), false, 0, PhaseSuspending, ""},
		{"after the consumption", append(suspended[:4:4],
			step{&ResumeRequested{Generation: 2, RestoreRef: "r1"}, true},
			step{&RetainedStateConsumed{Generation: 2, RestoreRef: "r1"}, true},
			step{exported("r1", 90), false}), false, 0, PhaseStarting, ""},
		{"cleared by the consumption", append(suspended[:4:4], step{exported("r1", 90), true},
			step{&ResumeRequested{Generation: 2, RestoreRef: "r1"}, true},
			step{&RetainedStateConsumed{Generation: 2, RestoreRef: "r1"}, true}), false, 0, PhaseStarting, ""},
		{"kept by a failed resume", append(suspended[:4:4], step{exported("r1", 90), true},
			step{&ResumeRequested{Generation: 2, RestoreRef: "r1"}, true},
			step{&ResumeFailed{Generation: 2}, true}), true, 90, PhaseSuspended, "r1"},
		{"cleared by a discard", append(suspended[:4:4], step{exported("r1", 90), true},
			step{&StartRequested{Generation: 2}, true},
			step{&RetainedStateDiscarded{RestoreRef: "r1"}, true}), false, 0, PhaseStarting, ""},
		{"cleared by a delete", append(suspended[:4:4], step{exported("r1", 90), true},
			step{&DeleteRequested{}, true},
			step{&RetainedStateInvalidated{RestoreRef: "r1"}, true}), false, 0, PhaseDeleting, ""},
		{"cleared by a retention expiry", append(suspended[:4:4], step{exported("r1", 90), true},
			step{&RetainedStateInvalidated{RestoreRef: "r1", Reason: ReasonExpired}, true}), false, 0, PhaseStopped, ""},
		{"a stale one after a new suspension", append(suspended[:4:4], step{exported("r1", 90), true},
			step{&ResumeRequested{Generation: 2, RestoreRef: "r1"}, true},
			step{&RetainedStateConsumed{Generation: 2, RestoreRef: "r1"}, true},
			step{&Resumed{Generation: 2, Outcome: OutcomeRestored}, true},
			step{&SupervisorAttached{Generation: 2}, true},
			step{&SuspendRequested{Generation: 2}, true},
			step{&Suspended{Generation: 2, RestoreRef: "r2"}, true},
			step{exported("r1", 90), false}), false, 0, PhaseSuspended, "r2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var v View
			for i, s := range c.steps {
				en, err := NewEnvelope("s1", s.e, Meta{}, time.Unix(int64(10+i), 0))
				if err != nil {
					t.Fatal(err)
				}
				en.Seq = uint64(i + 1)
				before := v
				took, err := v.Apply(en)
				if took != s.took {
					t.Fatalf("step %d (%s): took %v (%v), want %v", i, s.e.Type(), took, err, s.took)
				}
				if !s.took {
					if !errors.Is(err, ErrRefused) {
						t.Errorf("step %d (%s): %v, want ErrRefused", i, s.e.Type(), err)
					}
					if v.Seq != before.Seq || v.Restore != before.Restore || !v.UpdatedAt.Equal(before.UpdatedAt) {
						t.Errorf("step %d (%s) refused changed the view: %+v, was %+v", i, s.e.Type(), v, before)
					}
				}
			}
			if v.Phase != c.phase || v.Restore.Movable != c.movable || v.Restore.MovableBytes != c.bytes || v.Restore.RestoreRef != c.restoreOf {
				t.Errorf("view %s movable %v (%d bytes) on %q, want %s movable %v (%d bytes) on %q",
					v.Phase, v.Restore.Movable, v.Restore.MovableBytes, v.Restore.RestoreRef, c.phase, c.movable, c.bytes, c.restoreOf)
			}
		})
	}
}
