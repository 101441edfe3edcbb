package events

import "time"

// ResumeRequested: a resume command was accepted (intent). It mints
// Generation, the generation the restored workload runs under.
type ResumeRequested struct {
	Generation            int64  `json:"generation"`
	RestoreRef            string `json:"restore_ref"`
	RestartIfRestoreFails bool   `json:"restart_if_restore_fails"`
	// Node is where the resume is to run when not on the sandbox's node
	// (resume --node): the retained state moves there.
	Node string `json:"node,omitempty"`
}

// RetainedStateConsumed: the driver consumed the retained state behind
// RestoreRef; the point of no return of a resume.
type RetainedStateConsumed struct {
	Generation int64  `json:"generation"`
	RestoreRef string `json:"restore_ref"`
	// Node, when set, is the node the state was consumed on, another than
	// the sandbox's: the sandbox belongs to it from here on. Via is the
	// reference the state moved there under (the driver's export of
	// RestoreRef).
	Node string `json:"node,omitempty"`
	Via  string `json:"via,omitempty"`
}

// RetainedStateDiscarded: the retained state was dropped on purpose (an
// explicit start of a suspended sandbox is cold).
type RetainedStateDiscarded struct {
	RestoreRef string `json:"restore_ref"`
}

// RetainedStateInvalidated: the restore reference can no longer be used
// (delete, resource loss, or its retention expired).
type RetainedStateInvalidated struct {
	RestoreRef string `json:"restore_ref"`
	// Reason is Expired when an expiry invalidated it (in suspended, it
	// moves the sandbox to stopped); empty otherwise.
	Reason string `json:"reason,omitempty"`
}

// ResumeFailed: the restore failed before the retained state was consumed; the
// sandbox is suspended again and the resume may be retried.
type ResumeFailed struct {
	Generation int64  `json:"generation"`
	Message    string `json:"message,omitempty"`
	// Node and Reason (issue 29): the node that was asked and why it
	// refused, ReasonCannotRestore when the target said before anything
	// was consumed that it cannot restore this state (Message says what it
	// lacks); empty for any other failure.
	Node   string `json:"node,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// ReasonCannotRestore is a resume's failure before anything was consumed
// because its target said it cannot restore the state (issue 29).
const ReasonCannotRestore = "CannotRestore"

// Resumed: the driver restored (or, after a fallback, cold-started) the
// workload under Generation. Outcome is restored or cold_start_fallback.
type Resumed struct {
	Generation int64  `json:"generation"`
	Outcome    string `json:"outcome"`
	// RestoreStartedAt, RunningAt and LoadedAt are the driver's clock at
	// the stages of a restore (README "Resume latency"): the restore began
	// (the driver took the call), the guest runs again (vm: QEMU answered
	// the cont after the incoming snapshot; process: the thaw is done), and
	// for a lazy restore its memory is all loaded. Each is left out where
	// the driver does not say it (no driver restores lazily yet).
	RestoreStartedAt time.Time `json:"restore_started_at,omitzero"`
	RunningAt        time.Time `json:"running_at,omitzero"`
	LoadedAt         time.Time `json:"loaded_at,omitzero"`
}

// Event type names of this family (CONTRACT §3): stable, never renamed.
const (
	TypeResumeRequested          = "sandbox.resume_requested"
	TypeRetainedStateConsumed    = "sandbox.retained_state_consumed"
	TypeRetainedStateDiscarded   = "sandbox.retained_state_discarded"
	TypeRetainedStateInvalidated = "sandbox.retained_state_invalidated"
	TypeResumeFailed             = "sandbox.resume_failed"
	TypeResumed                  = "sandbox.resumed"
)

func (ResumeRequested) Type() string          { return TypeResumeRequested }
func (RetainedStateConsumed) Type() string    { return TypeRetainedStateConsumed }
func (RetainedStateDiscarded) Type() string   { return TypeRetainedStateDiscarded }
func (RetainedStateInvalidated) Type() string { return TypeRetainedStateInvalidated }
func (ResumeFailed) Type() string             { return TypeResumeFailed }
func (Resumed) Type() string                  { return TypeResumed }

func (e RetainedStateConsumed) SpeaksFor() int64 { return e.Generation }
func (e ResumeFailed) SpeaksFor() int64          { return e.Generation }
func (e Resumed) SpeaksFor() int64               { return e.Generation }

func init() {
	register(
		func() Event { return &ResumeRequested{} },
		func() Event { return &RetainedStateConsumed{} },
		func() Event { return &RetainedStateDiscarded{} },
		func() Event { return &RetainedStateInvalidated{} },
		func() Event { return &ResumeFailed{} },
		func() Event { return &Resumed{} },
	)
}
