package events

import "time"

// Reasons say why a phase is what it is (CONTRACT §6), CamelCase.
const (
	ReasonMainProcessExited      = "MainProcessExited"
	ReasonRetainedStateLost      = "RetainedStateLost"
	ReasonSuspendRejected        = "SuspendRejected"
	ReasonDeadlineExceeded       = "DeadlineExceeded"
	ReasonComputeResourceMissing = "ComputeResourceMissing"
	ReasonStartFailed            = "StartFailed"
)

// Outcomes of the last suspend or resume (CONTRACT §6).
const (
	OutcomeRestored          = "restored"
	OutcomeColdStartFallback = "cold_start_fallback"
	OutcomeRestoreFailed     = "restore_failed"
	OutcomeSuspendRejected   = "suspend_rejected"
	OutcomeSuspendTimedOut   = "suspend_timed_out"
)

// Created: a create command was accepted. Generation is the first supervisor
// generation, minted with the sandbox.
type Created struct {
	Name          string            `json:"name"`
	Driver        string            `json:"driver"`
	Node          string            `json:"node"`
	DriverOptions map[string]string `json:"driver_options,omitempty"`
	Command       []string          `json:"command,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Generation    int64             `json:"generation"`
	// EnvSealed holds the env values, sealed by the service (compute's
	// Credentials.SealEnv); Env then names the variables with each value
	// "(secret)". Events from before have it empty and Env in clear.
	EnvSealed string `json:"env_sealed,omitempty"`
	// ExpiresAt is the sandbox's time to live (create's ttl or expires_at;
	// zero for none) and OnExpiry what it then does (delete or stop);
	// RetainFor how long a retained state is held from its suspension
	// ("" for ever). See expiry.go.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	OnExpiry  string    `json:"on_expiry,omitempty"`
	RetainFor string    `json:"retain_for,omitempty"`
	// TTLPausesWhileSuspended is create's ttl_pauses_while_suspended: the
	// time spent suspended moves the expiry later (expiry.go, View).
	TTLPausesWhileSuspended bool `json:"ttl_pauses_while_suspended,omitempty"`
	// WakeOnTraffic is create's wake_on_traffic: a connection to one of
	// its forwards while it is suspended resumes it.
	WakeOnTraffic bool `json:"wake_on_traffic,omitempty"`
	// Idle is the sandbox's idle policy (create's or the server's
	// default), nil for none. See idle.go.
	Idle IdlePolicy `json:"idle,omitzero"`
}

// DeleteRequested: a delete command was accepted (intent).
type DeleteRequested struct{}

// Deleted: the driver released every resource of the sandbox.
type Deleted struct{}

// Event type names of this family (CONTRACT §3): stable, never renamed.
const (
	TypeCreated         = "sandbox.created"
	TypeDeleteRequested = "sandbox.delete_requested"
	TypeDeleted         = "sandbox.deleted"
)

func (Created) Type() string         { return TypeCreated }
func (DeleteRequested) Type() string { return TypeDeleteRequested }
func (Deleted) Type() string         { return TypeDeleted }

func init() {
	register(
		func() Event { return &Created{} },
		func() Event { return &DeleteRequested{} },
		func() Event { return &Deleted{} },
	)
}
