package events

// SuspendRequested: a suspend command was accepted (intent) for Generation.
type SuspendRequested struct {
	Generation int64 `json:"generation"`
}

// Suspended: the driver retained the workload's state behind RestoreRef.
type Suspended struct {
	Generation int64  `json:"generation"`
	RestoreRef string `json:"restore_ref"`
}

// SuspendRejected: the driver refused the suspension (or its deadline passed
// with the workload confirmed running); the sandbox stays ready, its forwards
// and sessions untouched. Reason is SuspendRejected or DeadlineExceeded.
type SuspendRejected struct {
	Generation int64  `json:"generation"`
	Reason     string `json:"reason,omitempty"`
	Message    string `json:"message,omitempty"`
}

func (SuspendRequested) Type() string { return "sandbox.suspend_requested" }
func (Suspended) Type() string        { return "sandbox.suspended" }
func (SuspendRejected) Type() string  { return "sandbox.suspend_rejected" }

func init() {
	register(
		func() Event { return &SuspendRequested{} },
		func() Event { return &Suspended{} },
		func() Event { return &SuspendRejected{} },
	)
}
