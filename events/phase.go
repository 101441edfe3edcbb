package events

// Phase is where a sandbox is in its lifecycle (CONTRACT §1). Clients must
// treat a phase they do not know as "other".
type Phase string

// The phases of CONTRACT §1. PhaseNone is the phase of a sandbox that does not exist yet.
const (
	PhaseNone         Phase = ""
	PhaseProvisioning Phase = "provisioning"
	PhaseReady        Phase = "ready"
	PhaseStopping     Phase = "stopping"
	PhaseStopped      Phase = "stopped"
	PhaseStarting     Phase = "starting"
	PhaseSuspending   Phase = "suspending"
	PhaseSuspended    Phase = "suspended"
	PhaseDeleting     Phase = "deleting"
	PhaseDeleted      Phase = "deleted"
	PhaseError        Phase = "error"
)

// Phases lists every phase of the contract, None excluded.
var Phases = []Phase{PhaseProvisioning, PhaseReady, PhaseStopping, PhaseStopped, PhaseStarting, PhaseSuspending, PhaseSuspended, PhaseDeleting, PhaseDeleted, PhaseError}

// Terminal reports whether no event moves a sandbox out of p.
func (p Phase) Terminal() bool { return p == PhaseDeleted || p == PhaseError }

// Transient reports whether p is a phase a sandbox only passes through, on
// its way to an outcome, under a deadline (CONTRACT §1, invariant 5).
func (p Phase) Transient() bool {
	switch p {
	case PhaseProvisioning, PhaseStopping, PhaseStarting, PhaseSuspending, PhaseDeleting:
		return true
	}
	return false
}

// Known reports whether p is one of the contract's phases.
func (p Phase) Known() bool {
	for _, q := range Phases {
		if p == q {
			return true
		}
	}
	return false
}
