package vm

import (
	"github.com/torpor/torpor/services/compute/supervisor"
)

// A sandbox's directory, <data>/vm/<sandbox id>, holds:
//
//	state.json      the driver's record of the sandbox (written by the driver only)
//	machine.json    the VM as QEMU runs it (driver)
//	run.json        the supervisor's record of its QEMU and the guest's exit (supervisor)
//	console.log     the guest's console (ttyS0): the workload's output, appended by every generation
//	supervisor.log  the supervisors' own logs
//	ram-<gen>       the guest's memory, a shared file QEMU maps (sparse)
//	snap-<gen>-<r>.state   a suspension's device state (QEMU's migration stream without the RAM)
//	qmp.sock, sup.sock     the QEMU monitors of the driver and of the supervisor
//
// A snapshot is written to a temporary name and renamed when complete; the
// JSON files are replaced whole.
const (
	stateFile   = "state.json"
	machineFile = "machine.json"
	runFile     = "run.json"
	consoleFile = "console.log"
	logFile     = "supervisor.log"
	qmpSocket   = "qmp.sock"
	supSocket   = "sup.sock"
	inSocket    = "incoming.sock" // a restore's device state comes in on it
)

// state is what the driver knows of one sandbox, across restarts of the
// service.
type state struct {
	// Generation is the newest generation started or resumed.
	Generation int64 `json:"generation"`
	// Supervisor and QEMU are the newest generation's processes.
	Supervisor supervisor.Proc `json:"supervisor"`
	QEMU       supervisor.Proc `json:"qemu"`
	// RAM is the file of the newest generation's memory.
	RAM string `json:"ram,omitempty"`
	// Accel is the accelerator the VM runs under.
	Accel string `json:"accel,omitempty"`
	// Failed is why the start of Generation was refused, for a repeat of it.
	Failed string `json:"failed,omitempty"`
	// Stopped: a stop or a discard ended the newest generation.
	Stopped bool `json:"stopped,omitempty"`
	// Suspension is the newest suspension; Consumed the newest resume.
	Suspension *suspension  `json:"suspension,omitempty"`
	Consumed   *consumption `json:"consumed,omitempty"`
}

// suspension is a snapshot made by a suspend of Generation; Held while it
// may still be restored.
type suspension struct {
	Generation int64  `json:"generation"`
	Ref        string `json:"ref"`
	Held       bool   `json:"held"`
	// State and RAM are the snapshot's files; Digest the state file's
	// SHA-256 (the reference names it too).
	State  string `json:"state"`
	RAM    string `json:"ram"`
	Digest string `json:"digest"`
	// Size is what the snapshot keeps on the node: the device state and the
	// RAM file's allocated bytes.
	Size int64 `json:"size"`
	// Exported is the reference of the snapshot in the object store, once
	// a resume on another node asked for it, or it was exported ahead
	// (ahead.go).
	Exported string `json:"exported,omitempty"`
	// Compat is what the snapshot needs of a node that restores it
	// (check.go), recorded at suspend; nil for a snapshot made before.
	Compat *compat `json:"compat,omitempty"`
	// Moving: a resume on another node asked for it (Export).
	Moving bool `json:"moving,omitempty"`
}

// consumption is the resume of Ref under Generation; Failed when the
// restored guest died after it was continued.
type consumption struct {
	Ref        string `json:"ref"`
	Generation int64  `json:"generation"`
	Failed     bool   `json:"failed,omitempty"`
}

// held is the reference of the retained state of the newest generation, if
// one is held.
func (s *state) held() (string, bool) {
	if s.Suspension != nil && s.Suspension.Held && s.Suspension.Generation == s.Generation {
		return s.Suspension.Ref, true
	}
	return "", false
}

// run is what a supervisor records of its QEMU.
type run struct {
	Supervisor int             `json:"supervisor"`
	Generation int64           `json:"generation"`
	QEMU       supervisor.Proc `json:"qemu"`
	// Exited and Code: the guest's workload ended with Code (or QEMU died,
	// as 128+signal).
	Exited bool `json:"exited,omitempty"`
	Code   int  `json:"code,omitempty"`
	// Suspended: QEMU ended because the generation was suspended.
	Suspended bool `json:"suspended,omitempty"`
}
