package process

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The freezers, as Observe's How names them and Config.Freezer forces them.
const (
	// FreezerV2 is the cgroup v2 freezer: cgroup.freeze, read back from
	// cgroup.events, and cgroup.kill.
	FreezerV2 = "cgroup v2"
	// FreezerV1 is the v1 freezer controller: freezer.state.
	FreezerV1 = "cgroup v1 freezer"
	// FreezerSignal stops the workload's process group with SIGSTOP: what
	// is left where no cgroup is writable. A process that leaves the group
	// (setsid, setpgid) escapes it.
	FreezerSignal = "SIGSTOP"
)

// freezers is the order in which Config.Freezer's default tries them.
var freezers = []string{FreezerV2, FreezerV1, FreezerSignal}

// Freezers lists the freezers, in the order the driver tries them.
func Freezers() []string { return slices.Clone(freezers) }

// group is one sandbox's workload: its processes, frozen, thawed and ended
// together.
type group interface {
	// freeze returns once every process of the group is frozen.
	freeze(ctx context.Context) error
	// thaw returns once none is frozen any more.
	thaw(ctx context.Context) error
	frozen() (bool, error)
	// signal sends sig to every process of the group.
	signal(sig syscall.Signal) error
	// kill sends SIGKILL to every process of the group, thawing it where a
	// frozen process cannot die.
	kill() error
	empty() (bool, error)
	// pids lists the live processes of the group.
	pids() ([]int, error)
}

// groupOf is the group of a workload whose main process is pgid (the
// leader of its process group), frozen by kind in cgroup.
func groupOf(kind, cgroup string, pgid int) (group, error) {
	switch kind {
	case FreezerV2:
		return cgroupV2{dir: cgroup}, nil
	case FreezerV1:
		return cgroupV1{dir: cgroup}, nil
	case FreezerSignal:
		return signalGroup{pgid: pgid}, nil
	}
	return nil, fmt.Errorf("unknown freezer %q", kind)
}

// Available reports whether the freezer kind can freeze process groups on
// this machine, and if not, why.
func Available(kind string) error {
	_, err := parentOf(kind)
	return err
}

// parentOf is the directory in which freezer kind makes a sandbox's cgroup:
// this process's own cgroup in that hierarchy (so a service whose cgroup is
// delegated to it makes them there), once a probe cgroup could be made and
// removed in it. FreezerSignal needs none.
func parentOf(kind string) (string, error) {
	var fstype, controller, knob string
	switch kind {
	case FreezerSignal:
		return "", nil
	case FreezerV2:
		fstype, knob = "cgroup2", "cgroup.freeze"
	case FreezerV1:
		fstype, controller, knob = "cgroup", "freezer", "freezer.state"
	default:
		return "", fmt.Errorf("unknown freezer %q (known: %s)", kind, strings.Join(freezers, ", "))
	}
	mount, root, err := findMount(fstype, controller)
	if err != nil {
		return "", fmt.Errorf("%s: %w", kind, err)
	}
	own, err := ownCgroup(controller)
	if err != nil {
		return "", fmt.Errorf("%s: %w", kind, err)
	}
	if root != "/" {
		own = strings.TrimPrefix(own, root)
	}
	parent := filepath.Join(mount, own)
	var b [6]byte
	_, _ = rand.Read(b[:])
	probe := filepath.Join(parent, fmt.Sprintf("torpor-probe-%d-%s", os.Getpid(), hex.EncodeToString(b[:])))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return "", fmt.Errorf("%s: cannot make a cgroup in %s: %w", kind, parent, err)
	}
	_, statErr := os.Stat(filepath.Join(probe, knob))
	if err := os.Remove(probe); err != nil {
		return "", fmt.Errorf("%s: remove the probe cgroup: %w", kind, err)
	}
	if statErr != nil {
		return "", fmt.Errorf("%s: a cgroup in %s has no %s: %w", kind, parent, knob, statErr)
	}
	return parent, nil
}

// findMount finds the mount point of a cgroup hierarchy in
// /proc/self/mountinfo (proc(5)): fstype cgroup2, or cgroup with controller
// among its options, and the root of the hierarchy it shows.
func findMount(fstype, controller string) (mount, root string, err error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || g[0] != fstype {
			continue
		}
		if controller != "" && !slices.Contains(strings.Split(g[2], ","), controller) {
			continue
		}
		return f[4], f[3], nil
	}
	if controller != "" {
		return "", "", fmt.Errorf("no %s hierarchy with the %s controller is mounted", fstype, controller)
	}
	return "", "", fmt.Errorf("no %s hierarchy is mounted", fstype)
}

// ownCgroup is this process's cgroup in the hierarchy of controller, or in
// the unified one for "" (/proc/self/cgroup).
func ownCgroup(controller string) (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" {
			return parts[2], nil
		}
		if controller != "" && slices.Contains(strings.Split(parts[1], ","), controller) {
			return parts[2], nil
		}
	}
	return "", fmt.Errorf("this process is in no cgroup of the %q hierarchy", controller)
}

// makeCgroup makes (or finds) the cgroup of a sandbox under parent, thawed.
func makeCgroup(ctx context.Context, kind, parent, id string) (string, error) {
	if kind == FreezerSignal {
		return "", nil
	}
	dir := filepath.Join(parent, "torpor-"+id)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("make cgroup: %w", err)
	}
	g, err := groupOf(kind, dir, 0)
	if err != nil {
		return "", err
	}
	// A cgroup left frozen by an earlier generation would freeze the new
	// one from its first instruction.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := g.thaw(ctx); err != nil {
		return "", err
	}
	return dir, nil
}

// removeCgroup removes a sandbox's empty cgroup, waiting for the kernel to
// let go of processes just ended.
func removeCgroup(ctx context.Context, dir string) error {
	if dir == "" {
		return nil
	}
	return until(ctx, func() (bool, error) {
		err := os.Remove(dir)
		switch {
		case err == nil, errors.Is(err, os.ErrNotExist):
			return true, nil
		case errors.Is(err, syscall.EBUSY):
			return false, nil
		}
		return false, fmt.Errorf("remove cgroup: %w", err)
	})
}

// joinCgroup moves process pid into the cgroup at dir: the hidden entry of
// the workload writes itself there before it executes the command.
func joinCgroup(dir string, pid int) error {
	return writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid))
}

// cgroupV2 freezes with cgroup.freeze.
type cgroupV2 struct{ dir string }

func (g cgroupV2) freeze(ctx context.Context) error { return g.set(ctx, "1") }
func (g cgroupV2) thaw(ctx context.Context) error   { return g.set(ctx, "0") }

// set writes v to cgroup.freeze and waits until cgroup.events says the
// whole cgroup is in that state ("frozen 1" or "frozen 0").
func (g cgroupV2) set(ctx context.Context, v string) error {
	if err := writeFile(filepath.Join(g.dir, "cgroup.freeze"), v); err != nil {
		return err
	}
	return until(ctx, func() (bool, error) {
		got, err := g.events("frozen")
		return got == v, err
	})
}

func (g cgroupV2) frozen() (bool, error) {
	v, err := g.events("frozen")
	return v == "1", err
}

// events is the value of key in cgroup.events.
func (g cgroupV2) events(key string) (string, error) {
	data, err := os.ReadFile(filepath.Join(g.dir, "cgroup.events"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s/cgroup.events has no %s", g.dir, key)
}

func (g cgroupV2) signal(sig syscall.Signal) error { return signalAll(g.dir, sig) }

func (g cgroupV2) pids() ([]int, error) { return cgroupPids(g.dir) }

func (g cgroupV2) kill() error {
	err := writeFile(filepath.Join(g.dir, "cgroup.kill"), "1")
	if errors.Is(err, os.ErrNotExist) { // before Linux 5.14
		return signalAll(g.dir, syscall.SIGKILL)
	}
	return err
}

func (g cgroupV2) empty() (bool, error) {
	v, err := g.events("populated")
	return v == "0", err
}

// cgroupV1 freezes with the v1 freezer controller's freezer.state.
type cgroupV1 struct{ dir string }

func (g cgroupV1) freeze(ctx context.Context) error { return g.set(ctx, "FROZEN") }
func (g cgroupV1) thaw(ctx context.Context) error   { return g.set(ctx, "THAWED") }

// set writes v to freezer.state until it reads back v. It says FREEZING
// while some task is not frozen yet, and the kernel tries a task only when
// FROZEN is written: one that was busy then (forking, say) is frozen by a
// write after.
func (g cgroupV1) set(ctx context.Context, v string) error {
	path := filepath.Join(g.dir, "freezer.state")
	return until(ctx, func() (bool, error) {
		if err := writeFile(path, v); err != nil {
			return false, err
		}
		got, err := os.ReadFile(path)
		return strings.TrimSpace(string(got)) == v, err
	})
}

func (g cgroupV1) frozen() (bool, error) {
	got, err := os.ReadFile(filepath.Join(g.dir, "freezer.state"))
	return strings.TrimSpace(string(got)) == "FROZEN", err
}

func (g cgroupV1) signal(sig syscall.Signal) error { return signalAll(g.dir, sig) }

func (g cgroupV1) pids() ([]int, error) { return cgroupPids(g.dir) }

// kill signals every task, then thaws the cgroup: a frozen task dies only
// once thawed.
func (g cgroupV1) kill() error {
	if err := signalAll(g.dir, syscall.SIGKILL); err != nil {
		return err
	}
	return writeFile(filepath.Join(g.dir, "freezer.state"), "THAWED")
}

func (g cgroupV1) empty() (bool, error) {
	pids, err := cgroupPids(g.dir)
	return len(pids) == 0, err
}

// cgroupPids lists the processes in the cgroup at dir.
func cgroupPids(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// signalAll sends sig to every process in the cgroup at dir.
func signalAll(dir string, sig syscall.Signal) error {
	pids, err := cgroupPids(dir)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal %d: %w", pid, err)
		}
	}
	return nil
}

// signalGroup freezes the process group pgid with SIGSTOP and thaws it with
// SIGCONT.
type signalGroup struct{ pgid int }

func (g signalGroup) freeze(ctx context.Context) error {
	if err := g.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return until(ctx, g.frozen)
}

func (g signalGroup) thaw(ctx context.Context) error {
	if err := g.signal(syscall.SIGCONT); err != nil {
		return err
	}
	return until(ctx, func() (bool, error) {
		ms, err := g.members()
		return !slices.ContainsFunc(ms, func(m member) bool { return m.stopped }), err
	})
}

// frozen: every process of the group is stopped, or cannot run before it
// stops.
func (g signalGroup) frozen() (bool, error) {
	ms, err := g.members()
	if err != nil || len(ms) == 0 {
		return false, err
	}
	return !slices.ContainsFunc(ms, func(m member) bool { return !m.stopped && !m.stopping() }), nil
}

func (g signalGroup) signal(sig syscall.Signal) error {
	if g.pgid <= 1 {
		return fmt.Errorf("no process group to signal")
	}
	if err := syscall.Kill(-g.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal process group %d: %w", g.pgid, err)
	}
	return nil
}

// kill: SIGKILL ends stopped processes too.
func (g signalGroup) kill() error { return g.signal(syscall.SIGKILL) }

func (g signalGroup) pids() ([]int, error) {
	ms, err := g.members()
	pids := make([]int, len(ms))
	for i, m := range ms {
		pids[i] = m.pid
	}
	return pids, err
}

func (g signalGroup) empty() (bool, error) {
	ms, err := g.members()
	return len(ms) == 0, err
}

// member is a live process of a signalled group.
type member struct {
	pid     int
	state   byte
	stopped bool
}

// stopping says whether m, not stopped, cannot run before it stops: it
// sleeps uninterruptibly with SIGSTOP pending. A shell that vforked a child
// which the SIGSTOP stopped before its exec waits so, for as long as the
// child is stopped.
func (m member) stopping() bool {
	if m.state != 'D' {
		return false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(m.pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&(1<<(syscall.SIGSTOP-1)) != 0 {
			return true
		}
	}
	return false
}

// members are the live processes of the group: a walk over /proc, as the
// kernel lists a process group nowhere else.
func (g signalGroup) members() ([]member, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var ms []member
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.Pgrp != g.pgid || st.Dead() {
			continue
		}
		ms = append(ms, member{pid: pid, state: st.State, stopped: st.State == 'T' || st.State == 't'})
	}
	return ms, nil
}

// writeFile writes v to an existing file (a cgroup's knob) in one write.
func writeFile(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(v); err != nil {
		f.Close()
		return fmt.Errorf("write %s to %s: %w", v, path, err)
	}
	return f.Close()
}
