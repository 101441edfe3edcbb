package compute

import "context"

// ReportSubject is the subject a supervisor of sandbox id reports on.
func ReportSubject(id string) string { return "torpor.supervisor." + id }

// Kinds of supervisor report. A heartbeat says the attached supervisor is
// still there (nothing is appended); a supervisor that has sent one and then
// falls silent past the gateway's limit is recorded detached.
const (
	ReportAttached  = "attached"
	ReportDetached  = "detached"
	ReportExited    = "exited"
	ReportHeartbeat = "heartbeat"
)

// Report is what a supervisor sends on ReportSubject: who it is (generation
// and credential) and what happened. ExitCode is set for ReportExited.
type Report struct {
	SandboxID  string `json:"sandbox_id"`
	Generation int64  `json:"generation"`
	Credential string `json:"credential"`
	Kind       string `json:"kind"`
	ExitCode   int    `json:"exit_code,omitempty"`
	// Beats, on an attach, says the supervisor heartbeats, every Beats
	// milliseconds: the gateways watch it from its attach, so that one cut
	// off before its first heartbeat is found silent too. A supervisor
	// that never beats (the sim's) leaves it out and is never watched.
	Beats int64 `json:"beats_ms,omitempty"`
	// Active, on a heartbeat, says the workload was busy since the beat
	// before: its processes' CPU time advanced by more than a threshold
	// (the process driver's supervisor: a fiftieth of the interval). The
	// gateway records it as activity (sandbox.active, source supervisor).
	Active bool `json:"active,omitempty"`
}

// Reporter delivers supervisor reports (over the bus in production).
type Reporter interface {
	Report(ctx context.Context, r Report) error
}

// ReporterFunc adapts a function to Reporter.
type ReporterFunc func(ctx context.Context, r Report) error

// Report calls f.
func (f ReporterFunc) Report(ctx context.Context, r Report) error { return f(ctx, r) }
