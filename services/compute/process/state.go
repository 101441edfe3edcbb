package process

import (
	"github.com/torpor/torpor/services/compute/supervisor"
)

// A sandbox's directory, <data>/process/<sandbox id>, holds:
//
//	work/           the workload's working directory (kept across stops)
//	stdout, stderr  the workload's output, appended by every generation
//	state.json      the driver's record of the sandbox (written by the driver only)
//	run.json        the supervisor's record of its workload (written by the supervisor only)
//	handoff.json    the generation and credential a resume hands the supervisor (driver)
//	supervisor.log  the supervisor's own log
//
// Each file has one writer and is replaced whole (a temporary file renamed
// over it), so a reader never sees half of one, and whatever the writer was
// doing when it was killed, the file holds what it held before or after.
const (
	workDir     = "work"
	stdoutFile  = "stdout"
	stderrFile  = "stderr"
	stateFile   = "state.json"
	runFile     = "run.json"
	handoffFile = "handoff.json"
	logFile     = "supervisor.log"
)

// state is what the driver knows of one sandbox, across restarts of the
// service: the newest generation, who runs it, and its retained state.
type state struct {
	// Generation is the newest generation started or resumed.
	Generation int64 `json:"generation"`
	// Freezer and Cgroup say how the workload's group is frozen (the
	// freezer chosen when it started) and, for the cgroup freezers, the
	// cgroup's directory.
	Freezer string `json:"freezer"`
	Cgroup  string `json:"cgroup,omitempty"`
	// Supervisor and Workload are the processes of the newest generation;
	// zero until its supervisor has said the workload runs. A resumed
	// generation keeps the supervisor and workload it thawed.
	Supervisor proc `json:"supervisor"`
	Workload   proc `json:"workload"`
	// Failed is why the start of Generation was refused, for a repeat of it.
	Failed string `json:"failed,omitempty"`
	// Stopped: a stop or a discard ended the newest generation.
	Stopped bool `json:"stopped,omitempty"`
	// Suspension is the newest suspension; Consumed the newest resume.
	Suspension *suspension  `json:"suspension,omitempty"`
	Consumed   *consumption `json:"consumed,omitempty"`
}

// suspension is a reference made by a suspend of Generation; Held while the
// frozen group behind it may still be resumed.
type suspension struct {
	Generation int64  `json:"generation"`
	Ref        string `json:"ref"`
	Held       bool   `json:"held"`
}

// consumption is the resume of Ref under Generation; Failed when the group
// behind it was gone.
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

// run is what a supervisor records of its workload.
type run struct {
	// Supervisor is the supervisor's pid: a record of another supervisor
	// (an older generation's) is not this one's.
	Supervisor int `json:"supervisor"`
	// Generation is the generation the supervisor reports as.
	Generation int64 `json:"generation"`
	Workload   proc  `json:"workload"`
	// Exited and Code: the workload's main process ended, with the code the
	// supervisor reported (a signal as 128+n).
	Exited bool `json:"exited,omitempty"`
	Code   int  `json:"code,omitempty"`
}

// handoff is what a resume hands the running supervisor: report as
// Generation, with Credential, from now on.
type handoff struct {
	Generation int64  `json:"generation"`
	Credential string `json:"credential"`
}

// The host helpers of the supervisors, as this package names them.
type proc = supervisor.Proc

var (
	writeJSON  = supervisor.WriteJSON
	readJSON   = supervisor.ReadJSON
	openAppend = supervisor.OpenAppend
	procOf     = supervisor.ProcOf
	isNotExist = supervisor.IsNotExist
	readStat   = supervisor.ReadStat
	lastLines  = supervisor.LastLines
	until      = supervisor.Until
)
