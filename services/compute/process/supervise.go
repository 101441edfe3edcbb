package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/supervisor"
)

// CredentialEnv is the environment variable through which a supervisor
// gets its credential (supervisor.CredentialEnv).
const CredentialEnv = supervisor.CredentialEnv

// ExecVerb is the hidden verb of the torpor binary through which a
// supervisor starts its workload: `torpor supervise-exec [--cgroup DIR] --
// CMD…` moves itself into the cgroup, then executes CMD in its own place
// (see Exec).
const ExecVerb = "supervise-exec"

// Supervision is one run of `torpor supervise`: the workload it starts and
// watches, and who it reports to, as whom.
type Supervision struct {
	Sandbox    string
	Generation int64
	Credential string
	NATSURL    string
	// NATSCA is a PEM file of CAs to trust for NATS over TLS; empty: the
	// system\'s.
	NATSCA string
	// BusCreds is the NATS credentials file's text the supervisor connects
	// with (supervisor.BusCredsEnv); empty: none.
	BusCreds string
	// Dir is the sandbox's directory in the process driver's layout: the
	// workload runs in Dir/work with its output appended to Dir/stdout and
	// Dir/stderr, the supervisor records it in Dir/run.json and takes new
	// generations from Dir/handoff.json. Empty: the workload runs in the
	// current directory with the supervisor's output, and nothing is
	// recorded.
	Dir string
	// Freezer and Cgroup are how the driver freezes the workload (default
	// FreezerSignal); the workload starts inside Cgroup.
	Freezer string
	Cgroup  string
	// Heartbeat is how often the attached supervisor says it is there.
	Heartbeat time.Duration
	// RunAs is whom the workload runs as (LookupUser; the driver passes
	// uid:gid); empty: the supervisor's user. The supervisor itself stays
	// who it is: it reaches NATS with its credential, which the workload
	// cannot read.
	RunAs string
	// Command and Env are the workload's.
	Command []string
	Env     []string
	// Ready, if set, is told "ok" once the workload runs, or why it does
	// not, and closed: the driver's Start waits on it.
	Ready *os.File
}

// Validate reports the first field s cannot run with.
func (s Supervision) Validate() error {
	switch {
	case s.Sandbox == "":
		return errors.New("supervise: no sandbox")
	case s.Generation < 1:
		return fmt.Errorf("supervise: generation %d, want 1 or more", s.Generation)
	case s.Credential == "":
		return fmt.Errorf("supervise: no credential (%s)", CredentialEnv)
	case s.NATSURL == "":
		return errors.New("supervise: no NATS URL")
	case len(s.Command) == 0:
		return errors.New("supervise: no command")
	case s.Heartbeat <= 0:
		return fmt.Errorf("supervise: heartbeat %s, want a positive interval", s.Heartbeat)
	}
	if s.RunAs != "" {
		if _, err := LookupUser(s.RunAs); err != nil {
			return fmt.Errorf("supervise: %w", err)
		}
	}
	_, err := groupOf(s.freezer(), s.Cgroup, 0)
	return err
}

func (s Supervision) freezer() string {
	if s.Freezer == "" {
		return FreezerSignal
	}
	return s.Freezer
}

// Supervise runs the workload and reports on it until it has exited and
// its exit is reported: it attaches as s.Generation (asking again until a
// gateway answers), heartbeats every s.Heartbeat, attaches again as the
// generation a resume hands it (SIGUSR1, Dir/handoff.json), and reports the
// workload's exit code (a signal as 128+n). A refusal (a fenced generation,
// a bad credential) is logged, not asked again. When ctx ends, the workload
// is sent SIGTERM and its exit reported as usual.
//
// The supervisor is the workload's parent and outside its freezer's group:
// it keeps the exit status and keeps heartbeating while the workload is
// frozen. It is a subreaper, so the workload's orphans are its children
// and are reaped; when the main process exits, what is left of the group
// is killed.
func Supervise(ctx context.Context, s Supervision, log zerolog.Logger) error {
	log = log.With().Str("sandbox_id", s.Sandbox).Logger()
	err := s.Validate()
	if err == nil {
		err = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	}
	if s.Ready != nil {
		syscall.CloseOnExec(int(s.Ready.Fd())) // the workload must not hold it open
	}
	if err != nil {
		s.tell(err)
		return err
	}
	chld := make(chan os.Signal, 1)
	usr1 := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(chld)
	defer signal.Stop(usr1)

	// Connected (or connecting: a service down now is asked again) before
	// the workload starts, so that a URL that cannot work refuses the start.
	nc, err := supervisor.Connect(s.NATSURL, s.Sandbox, s.BusCreds, s.NATSCA)
	if err != nil {
		err = fmt.Errorf("supervise: nats %s: %w", s.NATSURL, err)
		s.tell(err)
		return err
	}
	defer nc.Close()

	w, err := s.start()
	if err == nil {
		err = s.record(run{Supervisor: os.Getpid(), Generation: s.Generation, Workload: w})
	}
	if err != nil {
		s.tell(err)
		return err
	}
	s.tell(nil)
	log.Info().Int64("generation", s.Generation).Int("pid", w.Pid).Strs("command", s.Command).Msg("workload started")

	g, _ := groupOf(s.freezer(), s.Cgroup, w.Pid)
	v := &supervision{s: s, nc: nc, log: log, gen: s.Generation, cred: s.Credential, w: w, group: g, reports: supervisor.NewReports(&supervisor.Sender{NC: nc, Log: log})}
	return v.loop(ctx, chld, usr1)
}

// tell says on s.Ready whether the workload runs (err nil) and closes it.
func (s Supervision) tell(err error) { supervisor.Tell(s.Ready, err) }

// record writes r to Dir/run.json.
func (s Supervision) record(r run) error {
	if s.Dir == "" {
		return nil
	}
	if err := writeJSON(filepath.Join(s.Dir, runFile), r); err != nil {
		return fmt.Errorf("supervise: record: %w", err)
	}
	return nil
}

// start starts the workload through ExecVerb, in its own process group, and
// returns once its command executes (or why it could not).
func (s Supervision) start() (proc, error) {
	const self = "/proc/self/exe" // this torpor binary, for ExecVerb
	args := []string{self, ExecVerb}
	if s.Cgroup != "" {
		args = append(args, "--cgroup", s.Cgroup)
	}
	if s.RunAs != "" {
		args = append(args, "--run-as", s.RunAs)
	}
	args = append(append(args, "--"), s.Command...)
	cmd := &exec.Cmd{Path: self, Args: args, Env: s.Env,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true}, Stdout: os.Stdout, Stderr: os.Stderr}
	if s.Dir != "" {
		cmd.Dir = filepath.Join(s.Dir, workDir)
		out, err := openAppend(filepath.Join(s.Dir, stdoutFile))
		if err != nil {
			return proc{}, err
		}
		defer out.Close()
		errf, err := openAppend(filepath.Join(s.Dir, stderrFile))
		if err != nil {
			return proc{}, err
		}
		defer errf.Close()
		cmd.Stdout, cmd.Stderr = out, errf
	}
	// The exec entry says on this pipe why the exec failed; a successful
	// exec closes it (it is close-on-exec there), and the read ends.
	r, w, err := os.Pipe()
	if err != nil {
		return proc{}, err
	}
	defer r.Close()
	cmd.ExtraFiles = []*os.File{w}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return proc{}, fmt.Errorf("start %s: %w", s.Command[0], err)
	}
	why, _ := io.ReadAll(r)
	if len(why) > 0 {
		_ = cmd.Wait()
		return proc{}, fmt.Errorf("%s", why)
	}
	// From here the reaper of the loop waits for it (and for its orphans).
	p, err := procOf(cmd.Process.Pid)
	_ = cmd.Process.Release()
	return p, err
}

// supervision is the state of Supervise's loop.
type supervision struct {
	s     Supervision
	nc    *nats.Conn
	log   zerolog.Logger
	gen   int64
	cred  string
	w     proc
	group group
	// reports holds the attach and exit reports not answered for good
	// yet, in order: each is sent until a gateway takes or refuses it.
	reports *supervisor.Reports
	exited  bool
	// cpu measures the workload's CPU time between beats: a beat says
	// whether it was busy (compute.Report.Active).
	cpu cpuMeter
}

func (v *supervision) loop(ctx context.Context, chld, usr1 <-chan os.Signal) error {
	defer v.reports.Stop()
	v.reports.Add(v.report(compute.ReportAttached, 0))
	tick := time.NewTicker(v.s.Heartbeat)
	defer tick.Stop()
	done := ctx.Done()
	for {
		select {
		case <-chld:
			if code, ok := v.reap(); ok {
				v.exit(code)
			}
		case <-usr1:
			v.handoff()
		case <-tick.C:
			if !v.exited {
				r := v.report(compute.ReportHeartbeat, 0)
				r.Active = busy(v.cpu.used(v.group), v.s.Heartbeat)
				v.reports.Beat(r)
			}
		case <-v.reports.C():
			v.reports.Flush()
			if v.reports.Empty() && v.exited {
				return nil
			}
		case <-done:
			// Asked to end: the workload is, and its exit reported.
			done = nil
			if err := v.group.signal(syscall.SIGTERM); err != nil {
				v.log.Warn().Err(err).Msg("end the workload")
			}
		}
	}
}

func (v *supervision) report(kind string, code int) compute.Report {
	r := compute.Report{SandboxID: v.s.Sandbox, Generation: v.gen, Credential: v.cred, Kind: kind, ExitCode: code}
	if kind == compute.ReportAttached {
		r.Beats = v.s.Heartbeat.Milliseconds()
	}
	return r
}

// reap reaps every child that has ended, and returns the exit code of the
// workload's main process if it was one of them.
func (v *supervision) reap() (code int, main bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return code, main
		}
		if pid == v.w.Pid && !v.exited {
			main = true
			code = ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
		}
	}
}

// exit ends the rest of the main process's group (a sandbox lives as long
// as its main process), reaps it, then records and queues the exit: a
// driver that finds the exit recorded finds nothing of the group left.
func (v *supervision) exit(code int) {
	v.exited = true
	v.log.Info().Int64("generation", v.gen).Int("exit_code", code).Msg("workload exited")
	if err := v.group.kill(); err != nil && !errors.Is(err, os.ErrNotExist) {
		v.log.Warn().Err(err).Msg("end what is left of the workload")
	}
	// Reap what is left, so that nothing is orphaned to an init that may
	// reap late or never; a process that escaped the group is given up on.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = until(ctx, func() (bool, error) {
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			switch {
			case errors.Is(err, syscall.ECHILD):
				return true, nil
			case pid <= 0:
				return false, nil
			}
		}
	})
	if err := v.s.record(run{Supervisor: os.Getpid(), Generation: v.gen, Workload: v.w, Exited: true, Code: code}); err != nil {
		v.log.Error().Err(err).Msg("record the exit")
	}
	v.reports.Add(v.report(compute.ReportExited, code))
}

// handoff takes the generation a resume handed over, if it is newer: the
// supervisor attaches as it, and reports as it from then on.
func (v *supervision) handoff() {
	if v.s.Dir == "" || v.exited {
		return
	}
	var h handoff
	if err := readJSON(filepath.Join(v.s.Dir, handoffFile), &h); err != nil {
		v.log.Warn().Err(err).Msg("handoff")
		return
	}
	if h.Generation <= v.gen {
		return
	}
	v.gen, v.cred = h.Generation, h.Credential
	// An attach of the old generation not answered yet is moot.
	v.reports.Replace(v.report(compute.ReportAttached, 0))
	if err := v.s.record(run{Supervisor: os.Getpid(), Generation: v.gen, Workload: v.w}); err != nil {
		v.log.Error().Err(err).Msg("record the handoff")
	}
	v.log.Info().Int64("generation", v.gen).Msg("handed a new generation")
}

// Exec is the hidden entry through which a supervisor starts its workload
// (ExecVerb): it moves this process into the cgroup at dir, if any,
// becomes the user runAs names, if any (LookupUser; only root may join the
// cgroup, so this comes second), and executes argv in its place, so the
// workload is inside its freezer's group and its user from its first
// instruction, and so are all its children. When it cannot, it says why on
// file descriptor 3, if the supervisor passed one, and returns the error.
func Exec(cgroup, runAs string, argv []string) error {
	var why *os.File
	if _, err := unix.FcntlInt(3, unix.F_GETFD, 0); err == nil {
		why = os.NewFile(3, "exec-error")
		syscall.CloseOnExec(3)
	}
	err := execIn(cgroup, runAs, argv)
	if why != nil {
		_, _ = io.WriteString(why, err.Error())
	}
	return err
}

func execIn(cgroup, runAs string, argv []string) error {
	if len(argv) == 0 {
		return errors.New("no command")
	}
	if cgroup != "" {
		if err := joinCgroup(cgroup, os.Getpid()); err != nil {
			return fmt.Errorf("join cgroup %s: %w", cgroup, err)
		}
	}
	if runAs != "" {
		u, err := LookupUser(runAs)
		if err == nil {
			err = become(u)
		}
		if err != nil {
			return err
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	if err := syscall.Exec(path, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", path, err)
	}
	return nil
}
