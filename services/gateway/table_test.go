package gateway

import (
	"errors"
	"testing"

	"github.com/torpor/torpor/events"
)

// TestNextWalksEveryPair walks every (phase, event type) pair: the table's rows
// succeed with their target, every other pair is refused with a
// *TransitionError that maps to FAILED_PRECONDITION.
func TestNextWalksEveryPair(t *testing.T) {
	want := map[transitionKey]events.Phase{}
	for _, row := range Table {
		want[transitionKey{row.From, row.On}] = row.To
	}
	phases := append([]events.Phase{events.PhaseNone}, events.Phases...)
	types := append(events.Types(), "sandbox.from_the_future")
	allowed := 0
	for _, from := range phases {
		for _, on := range types {
			got, err := Next(from, on)
			if to, ok := want[transitionKey{from, on}]; ok {
				allowed++
				if err != nil || got != to {
					t.Errorf("Next(%q, %s) = %q, %v; want %q", from, on, got, err, to)
				}
				continue
			}
			var te *TransitionError
			if !errors.As(err, &te) {
				t.Errorf("Next(%q, %s) = %q, %v; want a *TransitionError", from, on, got, err)
				continue
			}
			if code := events.CodeOf(err); code != events.CodeFailedPrecondition {
				t.Errorf("Next(%q, %s): code %s, want FAILED_PRECONDITION", from, on, code)
			}
		}
	}
	if allowed != len(Table) {
		t.Errorf("walked %d allowed pairs, table has %d rows (a row names an unregistered type or phase?)", allowed, len(Table))
	}
}

// TestTableContract spot-checks the rows CONTRACT §1 spells out.
func TestTableContract(t *testing.T) {
	cases := []struct {
		from events.Phase
		on   string
		to   events.Phase
	}{
		{events.PhaseNone, "sandbox.created", events.PhaseProvisioning},
		{events.PhaseProvisioning, "supervisor.attached", events.PhaseReady},
		{events.PhaseStarting, "supervisor.attached", events.PhaseReady},
		{events.PhaseReady, "supervisor.detached", events.PhaseProvisioning},
		{events.PhaseReady, "sandbox.stop_requested", events.PhaseStopping},
		{events.PhaseStopping, "sandbox.stopped", events.PhaseStopped},
		{events.PhaseStopping, "sandbox.stop_rejected", events.PhaseReady},
		{events.PhaseStopped, "sandbox.start_requested", events.PhaseStarting},
		{events.PhaseReady, "sandbox.suspend_requested", events.PhaseSuspending},
		{events.PhaseSuspending, "sandbox.suspended", events.PhaseSuspended},
		{events.PhaseSuspending, "sandbox.suspend_rejected", events.PhaseReady},
		{events.PhaseSuspended, "sandbox.resume_requested", events.PhaseStarting},
		{events.PhaseSuspended, "sandbox.start_requested", events.PhaseStarting},
		{events.PhaseStarting, "sandbox.resume_failed", events.PhaseSuspended},
		{events.PhaseStarting, "sandbox.stopped", events.PhaseStopped},
		{events.PhaseSuspending, "sandbox.exited", events.PhaseError},
		{events.PhaseReady, "sandbox.exited", events.PhaseError},
		{events.PhaseError, "sandbox.delete_requested", events.PhaseDeleting},
		{events.PhaseDeleting, "sandbox.deleted", events.PhaseDeleted},
		{events.PhaseSuspended, "sandbox.resource_lost", events.PhaseError},
	}
	for _, c := range cases {
		if got, err := Next(c.from, c.on); err != nil || got != c.to {
			t.Errorf("Next(%q, %s) = %q, %v; want %q", c.from, c.on, got, err, c.to)
		}
	}
	for _, refused := range []struct {
		from events.Phase
		on   string
	}{
		{events.PhaseDeleted, "sandbox.delete_requested"},
		{events.PhaseSuspended, "sandbox.suspended"},
		{events.PhaseStopped, "sandbox.exited"},
		{events.PhaseSuspended, "sandbox.exited"},
		{events.PhaseError, "supervisor.attached"},
	} {
		if _, err := Next(refused.from, refused.on); err == nil {
			t.Errorf("Next(%q, %s) allowed; the contract refuses it", refused.from, refused.on)
		}
	}
}
