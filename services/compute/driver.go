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
