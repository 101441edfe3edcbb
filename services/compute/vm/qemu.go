package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/rs/zerolog"
)

// machine is one sandbox's VM as QEMU is asked to run it; a restore runs
// the same machine (QEMU takes an incoming state only into the machine it
// came from).
type machine struct {
	QEMU    string `json:"qemu"`
	Kernel  string `json:"kernel"`
	Initrd  string `json:"initrd"`
	RAM     string `json:"ram"` // the file that holds the guest's memory
	Console string `json:"console"`
	Memory  int    `json:"memory"` // MiB
	CPUs    int    `json:"cpus"`
	Accel   string `json:"accel"` // kvm or tcg
	// QMP is the driver's monitor socket, SupervisorQMP the supervisor's.
	QMP           string `json:"qmp"`
	SupervisorQMP string `json:"supervisor_qmp"`
}

// args is QEMU's command line for m: a microvm with no default devices,
// its memory in m.RAM (shared, so a suspend need not write it and a restore
// maps it back), the console (ttyS0) appended to m.Console, the guest's
// init speaking on ttyS1 (QEMU's stdout), and two monitors. incoming: wait
// for a migration stream (migrate-incoming) instead of booting. The guest
// has a virtio-net device on QEMU's user-mode network (net.go).
func (m machine) args(incoming bool) []string {
	a := []string{
		"-M", "microvm,memory-backend=mem",
		"-accel", m.Accel,
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-m", strconv.Itoa(m.Memory) + "M",
		"-smp", strconv.Itoa(m.CPUs),
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=on", m.Memory, optPath(m.RAM)),
		"-kernel", m.Kernel,
		"-initrd", m.Initrd,
		"-append", "console=ttyS0 quiet panic=-1 reboot=t init_on_free=1",
		"-chardev", "file,id=con,append=on,path=" + optPath(m.Console),
		"-serial", "chardev:con",
		"-chardev", "stdio,id=ctl,signal=off",
		"-device", "isa-serial,chardev=ctl,iobase=0x2f8,irq=3",
		// The guest's network (net.go): user-mode, isolated from the host
		// and the outside (restrict=on), reached only through the host
		// forwards Dial adds; none at boot.
		"-netdev", "user,id=" + netdev + ",restrict=on",
		"-device", "virtio-net-device,netdev=" + netdev,
		// Relative to QEMU's directory (the sandbox's, where both sockets
		// live): a socket's path is at most 107 bytes, a data directory's
		// may be longer.
		"-qmp", "unix:" + optPath(filepath.Base(m.QMP)) + ",server=on,wait=off",
		"-qmp", "unix:" + optPath(filepath.Base(m.SupervisorQMP)) + ",server=on,wait=off",
	}
	if m.Accel == AccelTCG {
		// Virtual time from the instruction count: with the host's clock,
		// the guest kernel's timer calibration hangs on a slow or nested
		// host (here, about half the boots stopped after "tsc: Marking TSC
		// unstable"); with it, every boot gets through.
		a = append(a, "-icount", "shift=auto")
	}
	if incoming {
		a = append(a, "-incoming", "defer")
	}
	return a
}

// optPath is path as the value of a QEMU option, where a comma ends the
// value unless doubled.
func optPath(path string) string { return strings.ReplaceAll(path, ",", ",,") }

// monitor is a QMP connection.
type monitor struct{ m *qmp.SocketMonitor }

// dial connects to the QMP socket at path, waiting (until ctx ends) for
// QEMU to make it.
func dial(ctx context.Context, path string) (*monitor, error) {
	// A socket path longer than sun_path holds is reached through the
	// directory's descriptor.
	if len(path) > 100 {
		d, err := os.Open(filepath.Dir(path))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		path = fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path))
	}
	var last error
	// QEMU makes the socket early and answers on it once it is set up
	// (tens of milliseconds under TCG): asked again soon at first, then
	// every 5 ms, so that a resume waits little past that.
	pause := 250 * time.Microsecond
	for {
		m, err := qmp.NewSocketMonitor("unix", path, 2*time.Second)
		if err == nil {
			if err = m.Connect(); err == nil {
				return &monitor{m: m}, nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp %s: %w (%w)", path, ctx.Err(), last)
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Millisecond)
	}
}

func (mo *monitor) close() { _ = mo.m.Disconnect() }

// run executes the QMP command with args and returns its "return".
func (mo *monitor) run(command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	out, err := mo.m.Run(b)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	return r.Return, nil
}

// ignoreShared sets x-ignore-shared: the migration stream leaves out the
// shared memory backend's pages, which stay in the RAM file.
func (mo *monitor) ignoreShared() error {
	_, err := mo.run("migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}},
	})
	return err
}

// status is the VM's run state (running, paused, inmigrate, postmigrate, …).
func (mo *monitor) status() (string, error) {
	out, err := mo.run("query-status", nil)
	if err != nil {
		return "", err
	}
	var s struct {
		Status string `json:"status"`
	}
	err = json.Unmarshal(out, &s)
	return s.Status, err
}

// migration is the state of the newest migration (completed, failed, …)
// and, if it failed, why.
func (mo *monitor) migration() (status, why string, err error) {
	out, err := mo.run("query-migrate", nil)
	if err != nil {
		return "", "", err
	}
	var s struct {
		Status string `json:"status"`
		Error  string `json:"error-desc"`
	}
	err = json.Unmarshal(out, &s)
	return s.Status, s.Error, err
}

// vcpuThreads is the host threads that run the guest's vCPUs
// (query-cpus-fast's thread-id of each), each once: under TCG with
// -icount one thread runs them all in turn.
func (mo *monitor) vcpuThreads() ([]int, error) {
	out, err := mo.run("query-cpus-fast", nil)
	if err != nil {
		return nil, err
	}
	var cpus []struct {
		Thread int `json:"thread-id"`
	}
	if err := json.Unmarshal(out, &cpus); err != nil {
		return nil, fmt.Errorf("qmp query-cpus-fast: %w", err)
	}
	var tids []int
	for _, c := range cpus {
		if c.Thread > 0 && !slices.Contains(tids, c.Thread) {
			tids = append(tids, c.Thread)
		}
	}
	if len(tids) == 0 {
		return nil, errors.New("qmp query-cpus-fast: no vCPU thread")
	}
	return tids, nil
}

// shellPath quotes path for the sh of QEMU's exec: migration URI.
func shellPath(path string) string { return "'" + strings.ReplaceAll(path, "'", `'\''`) + "'" }

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// accel picks the accelerator: KVM where /dev/kvm opens and a probe guest
// boots under it in time (on some hosts a KVM boot hangs before the kernel
// prints anything), else TCG; and why. The probe itself is the process's
// (probed, accel.go): a driver that forces none takes its answer.
type accel struct {
	once sync.Once
	mu   sync.Mutex
	kind string
	why  string
	set  bool // kind and why are the answer (known)
}

// probeTimeout bounds the KVM probe: a guest that boots at all under KVM
// says it is ready in well under this.
const probeTimeout = 4 * time.Second

// pick probes once, booting m (its RAM, console and sockets in dir) under
// KVM, and logs the answer on log.
func (a *accel) pick(ctx context.Context, forced string, m machine, dir string, log zerolog.Logger) (string, string) {
	a.once.Do(func() {
		kind, why := forced, "configured"
		if forced == "" {
			kind, why = probed.pick(ctx, m, dir)
		}
		a.mu.Lock()
		a.kind, a.why, a.set = kind, why, true
		a.mu.Unlock()
		logAccel(log, kind, why)
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.kind, a.why
}

// probeKVM boots m under KVM and waits for its init's ready line.
func probeKVM(ctx context.Context, m machine, dir string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	m.Accel, m.Memory, m.CPUs = AccelKVM, 64, 1
	m.RAM, m.Console = filepath.Join(dir, "ram"), filepath.Join(dir, "console")
	m.QMP, m.SupervisorQMP = filepath.Join(dir, "qmp.sock"), filepath.Join(dir, "sup.sock")
	if err := freshRAM(m.RAM, m.Memory); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.QEMU, m.args(false)...)
	cmd.Dir = dir
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string)
	go scanLines(out, lines)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return errors.New("QEMU ended before the guest was ready")
			}
			if l == lineReady {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("no guest ready in %s", probeTimeout)
		}
	}
}

// freshRAM makes the file at path a new, empty (sparse) guest memory of mib MiB.
func freshRAM(path string, mib int) error {
	_ = os.Remove(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(mib) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// feedIncoming has the paused QEMU behind mo take the device state in the
// file at path: QEMU listens on dir's inSocket (relative to its directory,
// dir: a socket's path is short) and the driver writes the file into it.
// No shell and no cat start for it, which a restore waited for. It returns
// once the state is written; the caller waits for the migration to
// complete.
func feedIncoming(ctx context.Context, mo *monitor, dir, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sock := filepath.Join(dir, inSocket)
	_ = os.Remove(sock)
	if _, err := mo.run("migrate-incoming", map[string]any{"uri": "unix:" + inSocket}); err != nil {
		return err
	}
	defer os.Remove(sock)
	at := sock
	if len(at) > 100 {
		d, err := os.Open(dir)
		if err != nil {
			return err
		}
		defer d.Close()
		at = fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), inSocket)
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", at)
	if err != nil {
		return fmt.Errorf("the incoming socket: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(dl)
	}
	if _, err := io.Copy(c, f); err != nil {
		return fmt.Errorf("the device state into QEMU: %w", err)
	}
	return nil
}
