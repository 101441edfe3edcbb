package supervisor

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Locks serializes a driver's calls on each sandbox; the zero value is
// ready to use. A sandbox's lock lives while it is held or waited for.
type Locks struct {
	mu    sync.Mutex
	locks map[string]*lock
}

// lock is one sandbox's; refs counts its holders and waiters.
type lock struct {
	mu   sync.Mutex
	refs int
}

// Lock takes sandbox id's lock and returns its release.
func (ls *Locks) Lock(id string) func() {
	ls.mu.Lock()
	l := ls.locks[id]
	if l == nil {
		if ls.locks == nil {
			ls.locks = map[string]*lock{}
		}
		l = &lock{}
		ls.locks[id] = l
	}
	l.refs++
	ls.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		ls.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(ls.locks, id)
		}
		ls.mu.Unlock()
	}
}

// ReadyFD is the descriptor on which a spawned supervisor says whether its
// workload runs (`torpor supervise --ready-fd 3`).
const ReadyFD = 3

// Spawn starts a supervisor (args[0] is the torpor binary) in dir, in a
// session of its own (no signal to the service's process group reaches it,
// and it outlives the service), its output appended to log, and waits
// until it says on ReadyFD that its workload runs (why is empty) or why it
// does not. The supervisor is reaped by this process while it lives; one
// started by an earlier process is an orphan, reaped by init.
func Spawn(ctx context.Context, args, env []string, dir, log string) (sup Proc, why string, err error) {
	logf, err := OpenAppend(log)
	if err != nil {
		return Proc{}, "", err
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return Proc{}, "", err
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path:        args[0],
		Args:        args,
		Env:         env,
		Dir:         dir,
		Stdout:      logf,
		Stderr:      logf,
		ExtraFiles:  []*os.File{w}, // ReadyFD
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return Proc{}, "", fmt.Errorf("start the supervisor: %w", err)
	}
	// The reaper ends with the supervisor, not with the driver: the
	// sandbox outlives both.
	go func() { _ = cmd.Wait() }()
	sup, _ = ProcOf(cmd.Process.Pid)

	answer := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		answer <- strings.TrimSpace(string(b))
	}()
	select {
	case a := <-answer:
		switch a {
		case "ok":
			return sup, "", nil
		case "":
			return Proc{}, "", fmt.Errorf("the supervisor ended without a word (its log: %s)", log)
		}
		return Proc{}, a, nil
	case <-ctx.Done():
		r.Close() // ends the reader
		return Proc{}, "", ctx.Err()
	}
}

// Tell says on ready (the supervisor's end of ReadyFD, if any) whether the
// workload runs (err nil) and closes it.
func Tell(ready *os.File, err error) {
	if ready == nil {
		return
	}
	msg := "ok\n"
	if err != nil {
		msg = err.Error() + "\n"
	}
	_, _ = io.WriteString(ready, msg)
	_ = ready.Close()
}

// Until calls done, with growing pauses in between, until it says true,
// fails, or ctx ends. The kernel tells of a frozen cgroup or an ended
// process, and QEMU of a finished migration, by no event a Go program can
// wait on portably, so this polls: first often, as most such waits are
// over at once (README, Drivers), then less.
func Until(ctx context.Context, done func() (bool, error)) error {
	pause := 20 * time.Microsecond
	var t *time.Timer
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if t == nil {
			t = time.NewTimer(pause)
			defer t.Stop()
		} else {
			t.Reset(pause)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 5*time.Millisecond)
	}
}
