package compute

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/torpor/torpor/events"
)

// Errors a driver answers with. Wrap them with detail; each carries its
// contract code (events.CodeOf reads it), the same across the bus.
var (
	// ErrUnimplemented: the driver does not have the capability.
	ErrUnimplemented error = &driverError{"driver lacks the capability", events.CodeUnimplemented}
	// ErrRejected: the driver refused the operation; nothing changed.
	ErrRejected error = &driverError{"driver rejected the operation", events.CodeFailedPrecondition}
	// ErrResourceMissing: the sandbox's compute resource is gone.
	ErrResourceMissing error = &driverError{"compute resource missing", events.CodeNotFound}
	// ErrUnknownRef: the restore reference is not (or no longer) valid: it
	// was consumed, discarded, superseded, or never made here.
	ErrUnknownRef error = &driverError{"unknown restore reference", events.CodeFailedPrecondition}
	// ErrUnavailable: the driver could not be reached or did not answer;
	// nothing is known of the call's effect and it may be repeated. The
	// sagas retry such a call until the phase's deadline: only an answer
	// (a rejection, a failure) is an outcome.
	ErrUnavailable error = &driverError{"driver unavailable", events.CodeUnavailable}
	// ErrNotDelivered: the call reached no driver: nobody serves the node
	// (on the bus, NATS answered that no one listens), or its time was up
	// before it was sent. Unlike a call that got no answer, it provably had
	// no effect. It is an ErrUnavailable (errors.Is holds for both), and
	// retried as one.
	ErrNotDelivered error = fmt.Errorf("%w: delivered to no driver", ErrUnavailable)
)

// driverError is a sentinel of the driver contract with its contract code.
type driverError struct {
	msg  string
	code events.Code
}

func (e *driverError) Error() string             { return e.msg }
func (e *driverError) ContractCode() events.Code { return e.code }

// Capabilities are what a driver can do for a sandbox with given options
// (GET /v1/drivers lists them). Fields are only added.
type Capabilities struct {
	// Suspend: the driver suspends and resumes (it is a Suspender).
	Suspend bool `json:"suspend"`
	// ResumeElsewhere: the retained state can be resumed on another node.
	ResumeElsewhere bool `json:"resume_on_another_node"`
	// Retains says what a suspension keeps ("the process group, frozen").
	Retains string `json:"retains,omitempty"`
	// RetainedSize: Observe says what a held state keeps
	// (Observation.RetainedBytes), so the view can show it.
	RetainedSize bool `json:"retained_size,omitempty"`
	// Accelerator is what the driver runs its sandboxes under where it has
	// a choice (vm: kvm or tcg), AcceleratorWhy why (vm: a KVM probe that
	// booted, one that did not within its bound and fell back to TCG, no
	// /dev/kvm, configured; or not probed yet).
	Accelerator    string `json:"accelerator,omitempty"`
	AcceleratorWhy string `json:"accelerator_why,omitempty"`
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

// SpecOf is what a driver is told of sandbox id, created as c.
func SpecOf(id string, c *events.Created) Spec {
	return Spec{SandboxID: id, Node: c.Node, Options: c.DriverOptions, Command: c.Command, Env: c.Env}
}

// Start asks for the workload of Generation to run with a supervisor that
// presents Credential when it attaches.
type Start struct {
	Spec       Spec   `json:"spec"`
	Generation int64  `json:"generation"`
	Credential string `json:"credential"`
	// BusCreds is the NATS credentials file (text) the supervisor connects
	// with: a user that may report for this sandbox and nothing else
	// (internal/busauth); empty where the service cannot mint one.
	BusCreds string `json:"bus_creds,omitempty"`
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
	// BusCreds is as Start's.
	BusCreds string `json:"bus_creds,omitempty"`
}

// ResumeResult says whether the retained state was consumed, on success and
// on failure alike: a failure with Consumed set is past the point of no return.
type ResumeResult struct {
	Consumed bool `json:"consumed"`
	// RestoreStartedAt, RunningAt and LoadedAt are the driver's clock at
	// the stages of a successful restore, as events.Resumed carries them
	// (README "Resume latency"); zero where the driver does not say.
	RestoreStartedAt time.Time `json:"restore_started_at,omitzero"`
	RunningAt        time.Time `json:"running_at,omitzero"`
	LoadedAt         time.Time `json:"loaded_at,omitzero"`
}

// Driver runs sandboxes on one node. Every effect is idempotent per (sandbox,
// generation, operation): a saga re-driven after a crash calls it again with
// the same arguments and must get the same outcome without a second effect.
//
// What not every driver can do is an optional interface of its own, found by
// type assertion as database/sql/driver finds its optional methods
// (Suspender, Observer, Logger, Dialer): a driver written without one keeps
// compiling, and torpor answers UNIMPLEMENTED (or knows less) instead. A
// wrapper of a driver must forward the optional interfaces it means to keep.
type Driver interface {
	// Capabilities reports what the driver can do for a sandbox with opts.
	// Suspend is honoured only when the driver is a Suspender.
	Capabilities(opts map[string]string) Capabilities
	// Start runs the workload (the first generation at create, or a cold
	// start), or answers an error wrapping ErrRejected when it cannot (the
	// command does not exist, say).
	Start(ctx context.Context, req Start) error
	// Stop stops the workload, keeping its storage.
	Stop(ctx context.Context, t Target) error
	// Delete releases every resource of the sandbox, retained states
	// included: every restore reference is invalid afterwards.
	Delete(ctx context.Context, spec Spec) error
}

// Suspender is a driver that suspends workloads and resumes them.
type Suspender interface {
	// Suspend retains the workload's state and returns its restore
	// reference (opaque to torpor), or an error wrapping ErrRejected or
	// ErrUnimplemented. It returns once the state is retained.
	Suspend(ctx context.Context, t Target) (string, error)
	// Resume restores a retained state under a new generation. A reference
	// that was consumed, discarded, superseded or never made is
	// ErrUnknownRef, not consumed.
	Resume(ctx context.Context, req Resume) (ResumeResult, error)
	// Discard releases a retained state that will not be restored.
	Discard(ctx context.Context, spec Spec, ref string) error
}

// SelfReporting is a driver whose workloads have no supervisor on the bus
// of their own (the sim reports for its sandboxes itself): the service
// mints no NATS user for them (Start.BusCreds stays empty), which saves a
// key pair and a signature per start.
type SelfReporting interface {
	ReportsItself() bool
}

// Logger is a driver that keeps its workloads' output (stdout and stderr,
// a VM's console): the last tail lines of it.
type Logger interface {
	Logs(ctx context.Context, spec Spec, tail int) ([]byte, error)
}

// Dialer is a driver whose workloads listen on ports torpor can reach, for
// forwards: a connection to port of the sandbox.
type Dialer interface {
	Dial(ctx context.Context, spec Spec, port int) (net.Conn, error)
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
	// RetainedBytes is what the retained state behind RestoreRef keeps on
	// its node (a VM's snapshot), where the driver knows it.
	RetainedBytes int64 `json:"retained_bytes,omitempty"`
	// Consumed is the restore reference the newest resume on this node
	// consumed, and ConsumedGeneration the generation it was consumed for,
	// whether the restore then succeeded or failed: what a passed resume
	// deadline reads when the resume's answer was lost (the point of no
	// return passed unseen). Empty and 0 when no resume consumed anything.
	Consumed           string `json:"consumed,omitempty"`
	ConsumedGeneration int64  `json:"consumed_generation,omitempty"`
}

// Observer is a driver that can say what is true of a sandbox now. The
// sagas ask before they compensate a passed deadline, so that an effect that
// succeeded while nobody listened is recorded as the success it was. A
// driver without it is taken to know nothing: a passed deadline then ends in
// the phase's failure.
type Observer interface {
	Observe(ctx context.Context, spec Spec) (Observation, error)
}

// Exporter is a Suspender whose retained state can move to another node
// (the vm driver's snapshots). A resume on another node first asks the
// sandbox's own node to export its reference, then asks the target node to
// resume the reference Export returned.
type Exporter interface {
	// Export makes the retained state behind ref restorable on any node and
	// returns the reference that names it there; ref stays valid on its own
	// node. It is idempotent: a repeated Export of ref returns the same
	// reference. A ref not held here is ErrUnknownRef.
	Export(ctx context.Context, spec Spec, ref string) (string, error)
}

// ExportAwaiter is an Exporter that exports a suspension's retained state
// ahead, in the background after Suspend answered (the vm driver on a node
// with peers, issue 29), and can wait for that export to finish.
type ExportAwaiter interface {
	// AwaitExport waits until the export ahead of ref of spec's sandbox
	// has finished and returns the reference the state moves under (what
	// Export would return) and its size: "" and 0 when no export of ref
	// runs or ran here (the node has no peers, the driver exports nothing
	// ahead, ref is not held), or it was stopped (ref consumed or
	// discarded meanwhile). An export that failed is its error.
	AwaitExport(ctx context.Context, spec Spec, ref string) (via string, bytes int64, err error)
}
