package torpor

import "github.com/torpor/torpor/events"

// The view and its phase, so that a caller needs no other import of
// torpor's. Phases are an open set: a server newer than this SDK may
// answer a phase not listed here, which callers treat as "other"
// (Phase.Known says whether it is one of these).
type (
	View  = events.View
	Phase = events.Phase
)

// The contract's phases (CONTRACT §1).
const (
	PhaseProvisioning = events.PhaseProvisioning
	PhaseReady        = events.PhaseReady
	PhaseStopping     = events.PhaseStopping
	PhaseStopped      = events.PhaseStopped
	PhaseStarting     = events.PhaseStarting
	PhaseSuspending   = events.PhaseSuspending
	PhaseSuspended    = events.PhaseSuspended
	PhaseDeleting     = events.PhaseDeleting
	PhaseDeleted      = events.PhaseDeleted
	PhaseError        = events.PhaseError
)
