package events

// StartRequested: an explicit start (or a cold-start fallback of a resume) was
// accepted. It mints Generation; the credential for it is minted by the saga.
type StartRequested struct {
	Generation int64 `json:"generation"`
	// Fallback is set when a failed restore falls back to a cold start.
	Fallback bool `json:"fallback,omitempty"`
}

// Started: the driver started the workload of Generation. The sandbox becomes
// ready only when that generation's supervisor attaches.
type Started struct {
	Generation int64 `json:"generation"`
	// CredentialHash is the SHA-256 (hex) of the credential the supervisor of
	// this generation must present. The credential itself is never logged.
	CredentialHash string `json:"credential_hash,omitempty"`
}

// StartFailed: the driver could not start the workload. Added to the contract's
// list of types (additions are allowed): it carries reason StartFailed.
type StartFailed struct {
	Generation int64  `json:"generation"`
	Message    string `json:"message,omitempty"`
}

// StopRequested: a stop command was accepted (intent).
type StopRequested struct {
	Generation int64 `json:"generation"`
}

// Stopped: the driver confirmed the workload stopped. Reason is set when the
// stop was not asked for (RetainedStateLost after a strict failed resume).
type Stopped struct {
	Generation int64  `json:"generation"`
	Reason     string `json:"reason,omitempty"`
}

// StopRejected: the driver refused to stop and the workload is observed running.
type StopRejected struct {
	Generation int64  `json:"generation"`
	Message    string `json:"message,omitempty"`
}

// Event type names of this family (CONTRACT §3): stable, never renamed.
const (
	TypeStartRequested = "sandbox.start_requested"
	TypeStarted        = "sandbox.started"
	TypeStartFailed    = "sandbox.start_failed"
	TypeStopRequested  = "sandbox.stop_requested"
	TypeStopped        = "sandbox.stopped"
	TypeStopRejected   = "sandbox.stop_rejected"
)

func (StartRequested) Type() string { return TypeStartRequested }
func (Started) Type() string        { return TypeStarted }
func (StartFailed) Type() string    { return TypeStartFailed }
func (StopRequested) Type() string  { return TypeStopRequested }
func (Stopped) Type() string        { return TypeStopped }
func (StopRejected) Type() string   { return TypeStopRejected }

func (e Started) SpeaksFor() int64      { return e.Generation }
func (e StartFailed) SpeaksFor() int64  { return e.Generation }
func (e Stopped) SpeaksFor() int64      { return e.Generation }
func (e StopRejected) SpeaksFor() int64 { return e.Generation }

func init() {
	register(
		func() Event { return &StartRequested{} },
		func() Event { return &Started{} },
		func() Event { return &StartFailed{} },
		func() Event { return &StopRequested{} },
		func() Event { return &Stopped{} },
		func() Event { return &StopRejected{} },
	)
}
