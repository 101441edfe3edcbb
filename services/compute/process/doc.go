// Package process is the "process" driver of CONTRACT §9 and the supervisor
// behind `torpor supervise`: a sandbox is a process group started from the
// create request's command in a directory of its own under the service's
// data directory, watched by a supervisor that attaches it as its
// generation, heartbeats, and reports its exit; a suspension freezes the
// whole group in place (cgroup v2, else the v1 freezer controller, else
// SIGSTOP) and a resume thaws it and hands the supervisor the new
// generation.
//
// The processes:
//
//	torpor serve (the driver)
//	  └─ torpor supervise        own session; outside the frozen group; a subreaper
//	       └─ the workload       own process group; inside the sandbox's cgroup from
//	                             its first instruction (torpor supervise-exec joins it,
//	                             then executes the command in its own place)
//
// Everything the driver knows of a sandbox is in the sandbox's directory
// (see state.go), so a service killed and started again finds its sandboxes
// running or frozen as they were, and every call is idempotent per
// (sandbox, generation, operation). Stopping the service stops no sandbox.
//
// Restore references look like "process:<node>:<sandbox>:<generation>:<random>";
// they name a frozen group on its node, and cannot be resumed elsewhere.
package process
