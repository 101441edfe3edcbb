package events

// SuspendRequested: a suspend command was accepted (intent) for Generation.
type SuspendRequested struct {
	Generation int64 `json:"generation"`
}

// Suspended: the driver retained the workload's state behind RestoreRef.
type Suspended struct {
	Generation int64  `json:"generation"`
	RestoreRef string `json:"restore_ref"`
	// Bytes is what the retained state keeps, where the driver says.
	Bytes int64 `json:"bytes,omitempty"`
}

// SuspendRejected: the driver refused the suspension (or its deadline passed
// with the workload confirmed running); the sandbox stays ready, its forwards
// and sessions untouched. Reason is SuspendRejected or DeadlineExceeded.
type SuspendRejected struct {
	Generation int64  `json:"generation"`
	Reason     string `json:"reason,omitempty"`
	Message    string `json:"message,omitempty"`
}

// Event type names of this family (CONTRACT §3): stable, never renamed.
const (
	TypeSuspendRequested = "sandbox.suspend_requested"
	TypeSuspended        = "sandbox.suspended"
	TypeSuspendRejected  = "sandbox.suspend_rejected"
)

func (SuspendRequested) Type() string { return TypeSuspendRequested }
func (Suspended) Type() string        { return TypeSuspended }
func (SuspendRejected) Type() string  { return TypeSuspendRejected }

func (e Suspended) SpeaksFor() int64       { return e.Generation }
func (e SuspendRejected) SpeaksFor() int64 { return e.Generation }

func init() {
	register(
		func() Event { return &SuspendRequested{} },
		func() Event { return &Suspended{} },
		func() Event { return &SuspendRejected{} },
	)
}
