package events

// Exited: the main process of Generation exited with Code. Recorded once; a
// terminal exit result is never overwritten.
type Exited struct {
	Generation int64 `json:"generation"`
	Code       int   `json:"code"`
}

// ResourceLost: the driver reports the sandbox's compute resource gone.
type ResourceLost struct {
	Generation int64  `json:"generation"`
	Message    string `json:"message,omitempty"`
}

// DeadlinePassed: a transient phase outlived its deadline. The compensation
// that follows it is recorded as events of its own.
type DeadlinePassed struct {
	Phase    Phase  `json:"phase"`
	Deadline string `json:"deadline"`
	// Extended is how long the deadline was extended because the log was
	// unavailable within it (a NATS election, a server down); empty when
	// it was not.
	Extended string `json:"extended,omitempty"`
}

// CleanupRequested: a passed deadline ended its phase in error, and the
// driver is to clean up after it (an intent, appended with the deadline):
// Action CleanupStop stops the workload of Generation, CleanupDelete
// removes every resource of the sandbox. The sagas call the driver again
// until it confirms (CleanedUp), across restarts. It moves no phase.
type CleanupRequested struct {
	Generation int64  `json:"generation"`
	Action     string `json:"action"`
}

// CleanedUp: the driver confirmed the clean-up a CleanupRequested asked for
// (done, or nothing left to clean). It moves no phase.
type CleanedUp struct {
	Generation int64  `json:"generation"`
	Action     string `json:"action"`
}

// The actions of a clean-up.
const (
	CleanupStop   = "stop"   // the workload that never attached, or never stopped
	CleanupDelete = "delete" // the resources of a delete that never finished
)

// Event type names of this family (CONTRACT §3, and additions to its
// types, as allowed): stable, never renamed.
const (
	TypeExited           = "sandbox.exited"
	TypeResourceLost     = "sandbox.resource_lost"
	TypeDeadlinePassed   = "sandbox.deadline_passed"
	TypeCleanupRequested = "sandbox.cleanup_requested"
	TypeCleanedUp        = "sandbox.cleaned_up"
)

func (Exited) Type() string           { return TypeExited }
func (ResourceLost) Type() string     { return TypeResourceLost }
func (DeadlinePassed) Type() string   { return TypeDeadlinePassed }
func (CleanupRequested) Type() string { return TypeCleanupRequested }
func (CleanedUp) Type() string        { return TypeCleanedUp }

func (e Exited) SpeaksFor() int64       { return e.Generation }
func (e ResourceLost) SpeaksFor() int64 { return e.Generation }

func init() {
	register(
		func() Event { return &Exited{} },
		func() Event { return &ResourceLost{} },
		func() Event { return &DeadlinePassed{} },
		func() Event { return &CleanupRequested{} },
		func() Event { return &CleanedUp{} },
	)
}
