package supervisor

import (
	"context"
	"encoding/json"
	"errors"
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
	r, err := start(args, env, dir, log)
	if err != nil {
		return Proc{}, "", fmt.Errorf("start the supervisor: %w", err)
	}
	defer r.ready.Close()
	why, err = await(ctx, r.ready, log)
	if err != nil || why != "" {
		return Proc{}, why, err
	}
	return r.Proc, "", nil
}

// started is a supervisor just started: its process, the read end of its
// ready pipe, and, when asked for, the write end of its job pipe.
type started struct {
	Proc       Proc
	ready, job *os.File
}

// start starts a supervisor (args[0] is the torpor binary) in dir, in a
// session of its own, its output appended to log, with its ready pipe on
// ReadyFD and, when withJob, a job pipe on JobFD. Its reaper ends with
// the supervisor, not with the driver: the sandbox outlives both.
func start(args, env []string, dir, log string, withJob ...bool) (started, error) {
	logf, err := OpenAppend(log)
	if err != nil {
		return started{}, err
	}
	defer logf.Close()
	var toClose, opened []*os.File
	defer func() {
		for _, f := range toClose {
			f.Close()
		}
	}()
	fail := func(err error) (started, error) {
		for _, f := range opened {
			f.Close()
		}
		return started{}, err
	}
	rr, rw, err := os.Pipe()
	if err != nil {
		return started{}, err
	}
	toClose, opened = append(toClose, rw), append(opened, rr)
	extra := []*os.File{rw} // ReadyFD
	var jw *os.File
	if len(withJob) > 0 && withJob[0] {
		jr, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		jw = w
		toClose, opened = append(toClose, jr), append(opened, jw)
		extra = append(extra, jr) // JobFD
	}
	cmd := &exec.Cmd{
		Path: args[0], Args: args, Env: env, Dir: dir, Stdout: logf, Stderr: logf,
		ExtraFiles:  extra,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	go func() { _ = cmd.Wait() }()
	p, _ := ProcOf(cmd.Process.Pid)
	return started{Proc: p, ready: rr, job: jw}, nil
}

// await reads what a supervisor says on its ready pipe r: "" once it runs,
// or why it does not; an error when it ended without a word (its log is at
// log) or ctx ended first.
func await(ctx context.Context, r *os.File, log string) (why string, err error) {
	answer := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		answer <- strings.TrimSpace(string(b))
	}()
	select {
	case a := <-answer:
		switch a {
		case "ok":
			return "", nil
		case "":
			return "", fmt.Errorf("the supervisor ended without a word (its log: %s)", log)
		}
		return a, nil
	case <-ctx.Done():
		r.Close() // ends the reader
		return "", ctx.Err()
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

// JobFD is the file descriptor a spare supervisor reads its job from (the
// driver passes --job-fd JobFD): the ready pipe is ReadyFD, this one next.
const JobFD = ReadyFD + 1

// A Spare is a supervisor started ahead of its job, which it waits for on
// JobFD: a driver that has one hands a start or a restore its job instead
// of starting a supervisor then, and saves the supervisor's own start (a
// Go program's: milliseconds a same-node resume waited for). A spare
// whose job pipe closes without a job (its driver ended) exits.
type Spare struct {
	Proc       Proc
	job, ready *os.File
}

// StartSpare starts a spare supervisor with args (which carry --ready-fd
// ReadyFD and --job-fd JobFD) and env, in its own session, its output
// appended to log until its job says where its sandbox's log is.
func StartSpare(args, env []string, dir, log string) (*Spare, error) {
	r, err := start(args, env, dir, log, true)
	if err != nil {
		return nil, fmt.Errorf("start a spare supervisor: %w", err)
	}
	return &Spare{Proc: r.Proc, job: r.job, ready: r.ready}, nil
}

// ErrSpareGone is a spare that could not be given its job (it had ended):
// nothing of the job was done, and a supervisor started afresh may do it.
var ErrSpareGone = errors.New("the spare supervisor is gone")

// Give hands s its job (JSON) and waits, as Spawn does, for the supervisor
// to say whether its workload runs; log is where it now writes.
func (s *Spare) Give(ctx context.Context, job any, log string) (sup Proc, why string, err error) {
	defer s.ready.Close()
	b, err := json.Marshal(job)
	if err != nil {
		s.job.Close()
		return Proc{}, "", err
	}
	_, err = s.job.Write(b)
	s.job.Close()
	if err != nil || !s.Proc.Alive() {
		return Proc{}, "", fmt.Errorf("%w: %v", ErrSpareGone, err)
	}
	why, err = await(ctx, s.ready, log)
	if err != nil || why != "" {
		return Proc{}, why, err
	}
	return s.Proc, "", nil
}

// Close lets s go without a job: it exits.
func (s *Spare) Close() {
	s.job.Close()
	s.ready.Close()
}

// ReadJob reads a spare supervisor's job (JSON) from the file descriptor
// fd into job, once the driver wrote it and closed its end.
func ReadJob(fd int, job any) error {
	f := os.NewFile(uintptr(fd), "job")
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("read the job: %w", err)
	}
	if len(b) == 0 {
		return errNoJob
	}
	return json.Unmarshal(b, job)
}

// errNoJob is a spare's job pipe closed without a job: its driver let it go.
var errNoJob = errors.New("no job: the driver let the spare go")

// NoJob reports whether err is a spare let go without a job.
func NoJob(err error) bool { return errors.Is(err, errNoJob) }
