package supervisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// WriteJSON replaces path with v's JSON (WriteFile).
func WriteJSON(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFile(path, data)
}

// WriteFile replaces path with data: a temporary file (0600) in the same
// directory renamed over it, so a reader never sees half of it. Not synced:
// the file must survive a crash of its writer, and a power loss ends the
// processes it describes anyway.
func WriteFile(path string, data []byte) (err error) {
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

// OpenAppend opens the file at path for appending, making it (0600) if it
// is missing: the workload's output and the supervisor's log.
func OpenAppend(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
}

// ReadJSON reads path into v; a missing file is os.ErrNotExist.
func ReadJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Proc names one process: its pid and its start time (in clock ticks since
// boot), so that a pid the kernel gave to another process since is not
// taken for it.
type Proc struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Stat is what /proc/<pid>/stat says of a process.
type Stat struct {
	State byte // R, S, D, T, t, Z, X, …
	Pgrp  int
	Start uint64
	// CPU is the CPU time the process has used, user and system, in
	// clock ticks (utime + stime).
	CPU uint64
}

// ReadStat reads /proc/<pid>/stat; a process that is not there is
// os.ErrNotExist.
func ReadStat(pid int) (Stat, error) {
	return readStat("/proc/"+strconv.Itoa(pid)+"/stat", pid)
}

// ReadTaskStat reads /proc/<pid>/task/<tid>/stat, what it says of one
// thread of process pid (its CPU, Start, its own); a thread that is not
// there is os.ErrNotExist. (/proc/<tid>/stat would say the whole process's.)
func ReadTaskStat(pid, tid int) (Stat, error) {
	return readStat("/proc/"+strconv.Itoa(pid)+"/task/"+strconv.Itoa(tid)+"/stat", tid)
}

func readStat(path string, pid int) (Stat, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Stat{}, err
	}
	// The command name, in parentheses, may hold anything: the fields
	// start after its last closing parenthesis.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 of Proc(5) (state), f[2] field 5 (pgrp), f[11] and
	// f[12] fields 14 and 15 (utime, stime), f[19] field 22 (starttime).
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	pgrp, err := strconv.Atoi(f[2])
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: pgrp: %w", pid, err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: starttime: %w", pid, err)
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: utime: %w", pid, err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: stime: %w", pid, err)
	}
	return Stat{State: f[0][0], Pgrp: pgrp, Start: start, CPU: utime + stime}, nil
}

// Dead says whether a process in this state has ended (a zombie is dead:
// its parent has yet to reap it, which on a machine whose init does not
// reap orphans is never).
func (s Stat) Dead() bool { return s.State == 'Z' || s.State == 'X' }

// ProcOf names the running process pid.
func ProcOf(pid int) (Proc, error) {
	st, err := ReadStat(pid)
	if err != nil {
		return Proc{}, err
	}
	return Proc{Pid: pid, Start: st.Start}, nil
}

// Alive says whether p still runs (a stopped or frozen process runs).
func (p Proc) Alive() bool {
	if p.Pid <= 0 {
		return false
	}
	st, err := ReadStat(p.Pid)
	return err == nil && st.Start == p.Start && !st.Dead()
}

// IsNotExist says whether err means a file is missing.
func IsNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }

// maxLogRead bounds how much of an output file LastLines reads back, whatever
// the lines' length.
const maxLogRead = 4 << 20

// LastLines returns the last n lines of the file at path (all of it for n
// < 1), at most maxLogRead bytes of them, each ending in a newline; nothing
// if the file does not exist.
func LastLines(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	// Read back from the end, a block at a time, until the part read holds
	// n line ends before its last line's.
	const block = 64 << 10
	var buf []byte
	ends := 0 // line ends in buf, but for the file's last byte's
	off := size
	for off > 0 && len(buf) < maxLogRead {
		k := min(block, off)
		off -= k
		chunk := make([]byte, k, k+int64(len(buf)))
		if _, err := f.ReadAt(chunk, off); err != nil {
			return nil, err
		}
		if buf == nil {
			ends -= bytes.Count(chunk[len(chunk)-1:], []byte("\n"))
		}
		ends += bytes.Count(chunk, []byte("\n"))
		buf = append(chunk, buf...)
		if n > 0 && ends >= n {
			break
		}
	}
	if len(buf) == 0 {
		return nil, nil
	}
	if buf[len(buf)-1] != '\n' {
		buf = append(buf, '\n')
	}
	if n > 0 {
		body := buf[:len(buf)-1]
		for i := len(body) - 1; i >= 0; i-- {
			if body[i] != '\n' {
				continue
			}
			if n--; n == 0 {
				return buf[i+1:], nil
			}
		}
	}
	if off > 0 {
		// Cut at a line start: the first line read may be the end of one.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 && i < len(buf)-1 {
			return buf[i+1:], nil
		}
	}
	return buf, nil
}
