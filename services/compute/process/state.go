package process

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// writeJSON replaces path with v's JSON: a temporary file in the same
// directory renamed over it. Not synced: the file must survive a crash of
// its writer, and a power loss ends the processes it describes anyway.
func writeJSON(path string, v any) (err error) {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// CreateTemp makes the file 0600.
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	return err
}

// openAppend opens the file at path for appending, making it (0600) if it
// is missing: the workload's output and the supervisor's log.
func openAppend(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
}

// readJSON reads path into v; a missing file is os.ErrNotExist.
func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// proc names one process: its pid and its start time (in clock ticks since
// boot), so that a pid the kernel gave to another process since is not
// taken for it.
type proc struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// stat is what /proc/<pid>/stat says of a process.
type stat struct {
	state byte // R, S, D, T, t, Z, X, …
	pgrp  int
	start uint64
}

// readStat reads /proc/<pid>/stat; a process that is not there is
// os.ErrNotExist.
func readStat(pid int) (stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	// The command name, in parentheses, may hold anything: the fields
	// start after its last closing parenthesis.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 of proc(5) (state), f[2] field 5 (pgrp), f[19] field 22 (starttime).
	if len(f) < 20 {
		return stat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	pgrp, err := strconv.Atoi(f[2])
	if err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: pgrp: %w", pid, err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: starttime: %w", pid, err)
	}
	return stat{state: f[0][0], pgrp: pgrp, start: start}, nil
}

// dead says whether a process in this state has ended (a zombie is dead:
// its parent has yet to reap it, which on a machine whose init does not
// reap orphans is never).
func (s stat) dead() bool { return s.state == 'Z' || s.state == 'X' }

// procOf names the running process pid.
func procOf(pid int) (proc, error) {
	st, err := readStat(pid)
	if err != nil {
		return proc{}, err
	}
	return proc{Pid: pid, Start: st.start}, nil
}

// alive says whether p still runs (a stopped or frozen process runs).
func (p proc) alive() bool {
	if p.Pid <= 0 {
		return false
	}
	st, err := readStat(p.Pid)
	return err == nil && st.start == p.Start && !st.dead()
}

// isNotExist says whether err means a file is missing.
func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
