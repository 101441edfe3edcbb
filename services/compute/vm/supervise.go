package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/supervisor"
)

// Supervision is one run of `torpor supervise --vm`: the QEMU of one
// generation of a sandbox, and who it reports to, as whom. The supervisor
// runs on the host beside QEMU (its parent); the guest needs no credential
// and no network.
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
	// Dir is the sandbox's directory (the vm driver's layout): QEMU runs
	// the machine of Dir/machine.json; the supervisor records itself and
	// the guest's exit in Dir/run.json.
	Dir string
	// Heartbeat is how often the attached supervisor says it is there.
	Heartbeat time.Duration
	// Restore: QEMU waits for an incoming state (the driver sends it and
	// continues the guest); the supervisor attaches once the guest runs.
	// Otherwise the guest boots and the supervisor attaches when its init
	// says it is ready.
	Restore bool
	// Ready, if set, is told "ok" once QEMU runs, or why it does not, and
	// closed: the driver's Start and Resume wait on it.
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
		return fmt.Errorf("supervise: no credential (%s)", supervisor.CredentialEnv)
	case s.NATSURL == "":
		return errors.New("supervise: no NATS URL")
	case s.Dir == "":
		return errors.New("supervise: no sandbox directory")
	case s.Heartbeat <= 0:
		return fmt.Errorf("supervise: heartbeat %s, want a positive interval", s.Heartbeat)
	}
	return nil
}

// Supervise runs the generation's QEMU and reports on it until QEMU has
// ended and what that means is reported: the guest's exit code (its init
// says it on ttyS1), or, when QEMU died with no word from the guest, 128
// plus the signal that killed it (or QEMU's own code). QEMU that ends
// because the driver suspended the generation is no exit: nothing is
// reported, and the next generation's supervisor attaches. It attaches as
// s.Generation (asking again until a gateway answers) and heartbeats every
// s.Heartbeat. When ctx ends, QEMU is ended and its end reported as usual.
func Supervise(ctx context.Context, s Supervision, log zerolog.Logger) error {
	log = log.With().Str("sandbox_id", s.Sandbox).Int64("generation", s.Generation).Logger()
	if s.Ready != nil {
		syscall.CloseOnExec(int(s.Ready.Fd())) // QEMU must not hold it open
	}
	err := s.Validate()
	var m machine
	if err == nil {
		err = supervisor.ReadJSON(filepath.Join(s.Dir, machineFile), &m)
	}
	if err != nil {
		s.tell(err)
		return err
	}
	// QEMU starts first and sets itself up (tens of milliseconds under
	// TCG) while the supervisor connects to NATS: a resume waits for the
	// longer of the two, not their sum. A supervisor that cannot connect
	// kills it before it says anything.
	cmd := exec.Command(m.QEMU, m.args(s.Restore)...)
	cmd.Dir = s.Dir
	cmd.Stderr = os.Stderr
	// QEMU lives no longer than its supervisor: a VM nobody reports on is
	// a VM nobody knows of.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		err = fmt.Errorf("supervise: start QEMU: %w", err)
		s.tell(err)
		return err
	}
	nc, err := supervisor.Connect(s.NATSURL, s.Sandbox, s.BusCreds, s.NATSCA)
	if err != nil {
		err = fmt.Errorf("supervise: nats %s: %w", s.NATSURL, err)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		s.tell(err)
		return err
	}
	defer nc.Close()
	q, _ := supervisor.ProcOf(cmd.Process.Pid)
	if err := s.record(run{Supervisor: os.Getpid(), Generation: s.Generation, QEMU: q}); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		s.tell(err)
		return err
	}
	s.tell(nil)
	log.Info().Int("qemu", q.Pid).Bool("restore", s.Restore).Msg("QEMU started")

	v := &vmSupervision{s: s, log: log, qemu: q, cmd: cmd, reports: supervisor.NewReports(&supervisor.Sender{NC: nc, Log: log})}
	return v.loop(ctx, out, m)
}

// tell says on s.Ready whether QEMU runs (err nil) and closes it.
func (s Supervision) tell(err error) { supervisor.Tell(s.Ready, err) }

func (s Supervision) record(r run) error {
	return supervisor.WriteJSON(filepath.Join(s.Dir, runFile), r)
}

// vmSupervision is the state of Supervise's loop.
type vmSupervision struct {
	s    Supervision
	log  zerolog.Logger
	qemu supervisor.Proc
	cmd  *exec.Cmd
	// reports holds the attach and exit reports not answered for good
	// yet, in order.
	reports  *supervisor.Reports
	attached bool
	// code is the exit code the guest's init said, if it said one.
	code  *int
	ended bool // QEMU ended and what it means is queued
	// vcpus is QEMU's threads that run the guest's vCPUs, once the
	// supervisor's monitor said them; cpu measures their CPU time between
	// beats: a beat says whether the guest was busy (compute.Report.Active,
	// vcpuBusy).
	vcpus []int
	cpu   supervisor.CPUMeter
	busy  bool // what the beat before said
}

func (v *vmSupervision) report(kind string, code int) compute.Report {
	r := compute.Report{SandboxID: v.s.Sandbox, Generation: v.s.Generation, Credential: v.s.Credential, Kind: kind, ExitCode: code}
	if kind == compute.ReportAttached {
		r.Beats = v.s.Heartbeat.Milliseconds()
	}
	return r
}

func (v *vmSupervision) loop(ctx context.Context, out io.Reader, m machine) error {
	// The monitor's askers end with the loop.
	ask, cancel := context.WithCancel(ctx)
	defer cancel()
	queue := v.reports.Add
	vcpus := make(chan []int, 1)
	attach := func(what string) {
		v.attached = true
		v.log.Info().Msg(what)
		queue(v.report(compute.ReportAttached, 0))
		go askVCPUs(ask, m.SupervisorQMP, vcpus, v.log)
	}
	lines := make(chan string, 16)
	go scanLines(out, lines)
	exited := make(chan error, 1)
	waited := false
	running := make(chan struct{})
	if v.s.Restore {
		go waitRunning(ctx, m.SupervisorQMP, running, v.log)
	}
	tick := time.NewTicker(v.s.Heartbeat)
	defer tick.Stop()
	defer v.reports.Stop()
	done := ctx.Done()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				// QEMU's stdout is closed: it ended (or is ending).
				lines = nil
				go func() { exited <- v.cmd.Wait() }()
				waited = true
				continue
			}
			switch {
			case l == lineReady && !v.s.Restore && !v.attached:
				attach("guest ready")
			case strings.HasPrefix(l, linePrefixExit) && v.code == nil:
				code, err := strconv.Atoi(strings.TrimPrefix(l, linePrefixExit))
				if err != nil {
					code = 255
				}
				v.code = &code
				v.log.Info().Int("exit_code", code).Msg("workload exited")
				_ = v.cmd.Process.Kill() // the guest has nothing else to do
			}
		case <-running:
			running = nil
			if !v.attached {
				attach("restored guest runs")
			}
		case err := <-exited:
			v.ended = true
			if r, ok := v.end(err); ok {
				queue(r)
			} else if v.reports.Empty() {
				return nil
			}
		case tids := <-vcpus:
			v.vcpus = tids
			v.log.Info().Ints("vcpu_threads", tids).Msg("measuring the guest's CPU time")
			v.vcpuUsed() // the first reading, from which the next beat counts
		case <-tick.C:
			if v.attached && !v.ended {
				r := v.report(compute.ReportHeartbeat, 0)
				used := v.vcpuUsed()
				r.Active = vcpuBusy(used, v.s.Heartbeat, m.Accel)
				if r.Active != v.busy {
					v.busy = r.Active
					v.log.Info().Dur("vcpu_cpu", used).Dur("interval", v.s.Heartbeat).Bool("active", r.Active).Msg("the guest's activity changed")
				}
				v.reports.Beat(r)
			}
		case <-v.reports.C():
			v.reports.Flush()
			if v.reports.Empty() && v.ended {
				return nil
			}
		case <-done:
			done = nil
			if !waited {
				_ = v.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
	}
}

// vcpuUsed is the CPU time the guest's vCPU threads used since the
// reading before (/proc/<qemu>/task/<tid>/stat of each); 0 before the
// threads are known, and at the first reading.
func (v *vmSupervision) vcpuUsed() time.Duration {
	if v.vcpus == nil {
		return 0
	}
	cur := make(map[supervisor.Proc]uint64, len(v.vcpus))
	for _, tid := range v.vcpus {
		st, err := supervisor.ReadTaskStat(v.qemu.Pid, tid)
		if err != nil || st.Dead() {
			continue
		}
		cur[supervisor.Proc{Pid: tid, Start: st.Start}] = st.CPU
	}
	return v.cpu.Used(cur)
}

// tcgIdleShare is the share of a heartbeat's interval a guest's vCPU
// thread uses under TCG when the guest does nothing, as a divisor: a
// twentieth (5%). TCG emulates the guest kernel's timers and idle loop on
// the host's CPU: an idle guest (`sleep 3600`, 1 or 2 vCPUs, -icount
// shift=auto, Debian's 6.1 cloud kernel) measured 0 to 30 ms in each 1 s
// beat, 19 ms on average, so the process driver's threshold alone (a
// fiftieth, 20 ms) would call it active one beat in three; a guest spinning
// in a shell loop measured 410 to 920 ms in each (on a loaded 2-core host).
// Under KVM a halted vCPU sleeps in the host kernel: no baseline.
const tcgIdleShare = 20

// vcpuBusy says whether the guest's vCPUs used enough CPU time over a
// heartbeat's interval to make the guest active: the process driver's
// threshold (supervisor.Busy, a fiftieth of the interval), over what an
// idle guest uses under TCG (tcgIdleShare). Under TCG a guest is active
// above 7% of a CPU, under KVM above 2%.
func vcpuBusy(used, interval time.Duration, accel string) bool {
	if accel == AccelTCG {
		used -= interval / tcgIdleShare
	}
	return supervisor.Busy(used, interval)
}

// askVCPUs sends on out the guest's vCPU threads, asking QEMU's supervisor
// monitor (again a second later if it fails) until it answers or ctx ends.
func askVCPUs(ctx context.Context, path string, out chan<- []int, log zerolog.Logger) {
	for {
		mo, err := dial(ctx, path)
		if err != nil {
			return // ctx ended
		}
		tids, err := mo.vcpuThreads()
		mo.close()
		if err == nil {
			out <- tids
			return
		}
		log.Warn().Err(err).Msg("the guest's vCPU threads: its CPU time is not measured yet")
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// end says what QEMU's end (err is its Wait's) means, records it, and
// returns the report to send, if any: the guest's exit code; nothing when
// the driver suspended this generation (its state is retained, not ended);
// else QEMU's death as the workload's exit.
func (v *vmSupervision) end(err error) (compute.Report, bool) {
	code := 0
	switch {
	case v.code != nil:
		code = *v.code
	case v.suspended():
		v.log.Info().Msg("QEMU ended for a suspension")
		if rerr := v.s.record(run{Supervisor: os.Getpid(), Generation: v.s.Generation, QEMU: v.qemu, Suspended: true}); rerr != nil {
			v.log.Error().Err(rerr).Msg("record the suspension")
		}
		return compute.Report{}, false
	default:
		code = exitCode(err)
		v.log.Warn().Err(err).Int("exit_code", code).Msg("QEMU ended with no word from the guest")
	}
	if rerr := v.s.record(run{Supervisor: os.Getpid(), Generation: v.s.Generation, QEMU: v.qemu, Exited: true, Code: code}); rerr != nil {
		v.log.Error().Err(rerr).Msg("record the exit")
	}
	return v.report(compute.ReportExited, code), true
}

// suspended says whether the driver suspended this generation: it records
// the suspension before it ends QEMU.
func (v *vmSupervision) suspended() bool {
	var st state
	if err := supervisor.ReadJSON(filepath.Join(v.s.Dir, stateFile), &st); err != nil {
		return false
	}
	s := st.Suspension
	return s != nil && s.Held && s.Generation == v.s.Generation
}

// exitCode is a Wait's error as an exit code: a signal as 128+n.
func exitCode(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err == nil {
			return 0
		}
		return 255
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// scanLines sends r's lines on out, trimmed, and closes it at r's end.
func scanLines(r io.Reader, out chan<- string) {
	defer close(out)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		out <- strings.TrimSpace(strings.TrimRight(sc.Text(), "\r"))
	}
}

// waitRunning closes running once the restored guest runs (the driver
// continued it), asking QEMU's supervisor monitor.
func waitRunning(ctx context.Context, path string, running chan<- struct{}, log zerolog.Logger) {
	mo, err := dial(ctx, path)
	if err != nil {
		log.Warn().Err(err).Msg("supervisor monitor")
		return
	}
	defer mo.close()
	err = supervisor.Until(ctx, func() (bool, error) {
		s, err := mo.status()
		return s == "running", err
	})
	if err != nil {
		log.Warn().Err(err).Msg("waiting for the restored guest to run")
		return
	}
	close(running)
}
