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
}

// Event type names of this family (CONTRACT §3): stable, never renamed.
const (
	TypeExited         = "sandbox.exited"
	TypeResourceLost   = "sandbox.resource_lost"
	TypeDeadlinePassed = "sandbox.deadline_passed"
)

func (Exited) Type() string         { return TypeExited }
func (ResourceLost) Type() string   { return TypeResourceLost }
func (DeadlinePassed) Type() string { return TypeDeadlinePassed }

func (e Exited) SpeaksFor() int64       { return e.Generation }
func (e ResourceLost) SpeaksFor() int64 { return e.Generation }

func init() {
	register(
		func() Event { return &Exited{} },
		func() Event { return &ResourceLost{} },
		func() Event { return &DeadlinePassed{} },
	)
}
