package compute

import (
	"context"
	"errors"
)

// Errors a driver answers with. Wrap them with detail.
var (
	// ErrUnimplemented: the driver does not have the capability.
	ErrUnimplemented = errors.New("driver lacks the capability")
	// ErrRejected: the driver refused the operation; nothing changed.
	ErrRejected = errors.New("driver rejected the operation")
	// ErrResourceMissing: the sandbox's compute resource is gone.
	ErrResourceMissing = errors.New("compute resource missing")
	// ErrUnknownRef: the restore reference is not (or no longer) valid.
	ErrUnknownRef = errors.New("unknown restore reference")
	// ErrUnavailable: the driver could not be reached or did not answer;
	// nothing is known of the call's effect and it may be repeated. The
	// sagas retry such a call until the phase's deadline: only an answer
	// (a rejection, a failure) is an outcome.
	ErrUnavailable = errors.New("driver unavailable")
)

// Capabilities are what a driver can do for a sandbox with given options.
type Capabilities struct {
	Suspend bool `json:"suspend"`
}

// Spec is everything a driver knows about a sandbox; every call carries it,
// so a driver may keep no state of its own across restarts of the service.
type Spec struct {
	SandboxID string            `json:"sandbox_id"`
	Node      string            `json:"node"`
	Options   map[string]string `json:"options,omitempty"`
	Command   []string          `json:"command,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
}

// Start asks for the workload of Generation to run with a supervisor that
// presents Credential when it attaches.
type Start struct {
	Spec       Spec   `json:"spec"`
	Generation int64  `json:"generation"`
	Credential string `json:"credential"`
}

// Target names the running workload of one generation of one sandbox.
type Target struct {
	Spec       Spec  `json:"spec"`
	Generation int64 `json:"generation"`
}

// Resume asks for the retained state behind RestoreRef to be restored under
// the new Generation, whose supervisor presents Credential.
type Resume struct {
	Spec       Spec   `json:"spec"`
	Generation int64  `json:"generation"`
	Credential string `json:"credential"`
	RestoreRef string `json:"restore_ref"`
}

// ResumeResult says whether the retained state was consumed, on success and
// on failure alike: a failure with Consumed set is past the point of no return.
type ResumeResult struct {
	Consumed bool `json:"consumed"`
}

// Driver runs sandboxes on one node. Every effect is idempotent per (sandbox,
// generation, operation): a saga re-driven after a crash calls it again with
// the same arguments and must get the same outcome without a second effect.
type Driver interface {
	// Capabilities reports what the driver can do for a sandbox with opts.
	Capabilities(opts map[string]string) Capabilities
	// Start runs the workload (create or cold start).
	Start(ctx context.Context, req Start) error
	// Stop stops the workload, keeping its storage.
	Stop(ctx context.Context, t Target) error
	// Suspend retains the workload's state and returns its restore reference,
	// or ErrUnimplemented, or an error wrapping ErrRejected.
	Suspend(ctx context.Context, t Target) (string, error)
	// Resume restores a retained state under a new generation.
	Resume(ctx context.Context, req Resume) (ResumeResult, error)
	// Discard releases a retained state that will not be restored.
	Discard(ctx context.Context, spec Spec, ref string) error
	// Delete releases every resource of the sandbox, retained states included.
	Delete(ctx context.Context, spec Spec) error
}

// State is what a driver observes of a sandbox's workload.
type State string

// The states Observe reports.
const (
	// StateRunning: the workload of Observation.Generation runs.
	StateRunning State = "running"
	// StateFrozen: the workload is suspended, its state retained behind
	// Observation.RestoreRef.
	StateFrozen State = "frozen"
	// StateStopped: no workload runs; the sandbox's storage is kept.
	StateStopped State = "stopped"
	// StateExited: the main process of Observation.Generation ended on its
	// own with Observation.ExitCode.
	StateExited State = "exited"
	// StateGone: the driver holds nothing of the sandbox.
	StateGone State = "gone"
)

// Observation is what is true of a sandbox on its node now.
type Observation struct {
	State      State  `json:"state"`
	Generation int64  `json:"generation,omitempty"`
	ExitCode   int    `json:"exit_code,omitempty"`
	RestoreRef string `json:"restore_ref,omitempty"`
	// How says how the state is kept, where the driver has a choice (the
	// process driver's freezer, say).
	How string `json:"how,omitempty"`
}

// Observer is a driver that can say what is true of a sandbox now. The
// sagas ask before they compensate a passed deadline, so that an effect that
// succeeded while nobody listened is recorded as the success it was. A
// driver without it is taken to know nothing: a passed deadline then ends in
// the phase's failure.
type Observer interface {
	Observe(ctx context.Context, spec Spec) (Observation, error)
}
