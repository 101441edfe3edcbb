package vm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/supervisor"
)

var (
	_ compute.Driver        = (*Driver)(nil)
	_ compute.Suspender     = (*Driver)(nil)
	_ compute.Exporter      = (*Driver)(nil)
	_ compute.ExportAwaiter = (*Driver)(nil)
	_ compute.Observer      = (*Driver)(nil)
	_ compute.Logger        = (*Driver)(nil)
	_ compute.SpecValidator = (*Driver)(nil)
)

// KernelEnv names the guest kernel when Config.Kernel (torpor serve
// --vm-kernel) is empty; DefaultKernel is where deploy/vm-kernel puts it,
// taken when neither names one.
const (
	KernelEnv     = "TORPOR_VM_KERNEL"
	DefaultKernel = "/var/lib/torpor/vm/vmlinuz"
)

// Limits of the driver options.
const (
	DefaultMemory = 128 // MiB
	MinMemory     = 64
	MaxMemory     = 16384
	DefaultCPUs   = 1
	MaxCPUs       = 16
)

// Config says where the driver keeps its sandboxes and how it runs them.
type Config struct {
	// Data is the node's data directory; sandbox id lives in
	// <Data>/vm/<id>, the guest images in <Data>/vm/images.
	Data string
	// NATSURL is where the supervisors report.
	NATSURL string
	// NATSCA is a PEM file of the CAs a supervisor trusts for a NATS
	// server with TLS (supervise --nats-ca); empty: the system's.
	NATSCA string
	// Binary is the torpor executable the supervisors run; default
	// os.Executable().
	Binary string
	// Kernel is the guest kernel (a bzImage, Debian's cloud kernel); empty:
	// $TORPOR_VM_KERNEL.
	Kernel string
	// QEMU is qemu-system-x86_64 (default: found on PATH); Busybox the
	// static busybox the guest runs (default /bin/busybox).
	QEMU    string
	Busybox string
	// Accel forces an accelerator (AccelKVM, AccelTCG); empty probes KVM
	// once and falls back to TCG.
	Accel string
	// Log is where the driver says which accelerator its VMs get and why
	// (once, at the first boot; a KVM that did not boot in time, a
	// warning); the zero Logger says nothing.
	Log zerolog.Logger
	// Heartbeat is how often supervisors heartbeat; default 5s.
	Heartbeat time.Duration
	// Snapshots is the object store (torpor_snapshots) snapshots move
	// through between nodes; nil: this node's snapshots cannot move.
	Snapshots jetstream.ObjectStore
	// ExportAhead: a suspension puts its movable snapshot into Snapshots
	// in the background once it is recorded (a node with peers: a resume
	// on another node then only fetches it; ahead.go).
	ExportAhead bool
	// ExportDelay is how long after a suspend its export ahead begins;
	// 0: DefaultExportDelay.
	ExportDelay time.Duration

	// afterCont is a test's hook, called with QEMU's pid once a restored
	// guest was continued; beforeCont one that makes Resume return its
	// error just before the restored guest would be continued, as if the
	// driver died there.
	afterCont  func(pid int)
	beforeCont func() error
	// beforeExport is a test's hook an export calls once the snapshot's
	// files are open, before it writes anything (it holds the export under
	// way).
	beforeExport func()
}

// Driver is the vm driver: each sandbox is a QEMU microVM. Like the process
// driver it holds nothing in memory that matters: a Driver made on the data
// directory of an earlier one carries on with its sandboxes.
type Driver struct {
	cfg    Config
	root   string
	images images
	accel  accel

	locks supervisor.Locks
	ahead exports

	// spare is a supervisor started ahead for the next start or restore
	// (spare.go), nil while none is.
	spareMu sync.Mutex
	spare   *supervisor.Spare
}

// New returns a vm driver over cfg. What it needs on the node (QEMU, the
// kernel, busybox) is checked at each create (ValidateSpec), so that a node
// without it still runs its other drivers.
func New(cfg Config) (*Driver, error) {
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 5 * time.Second
	}
	switch {
	case cfg.Data == "":
		return nil, errors.New("vm driver: no data directory")
	case cfg.NATSURL == "":
		return nil, errors.New("vm driver: no NATS URL for the supervisors")
	case cfg.Accel != "" && cfg.Accel != AccelKVM && cfg.Accel != AccelTCG:
		return nil, fmt.Errorf("vm driver: accelerator %q: want %s or %s", cfg.Accel, AccelKVM, AccelTCG)
	}
	if cfg.Kernel == "" {
		cfg.Kernel = os.Getenv(KernelEnv)
	}
	if _, err := os.Stat(DefaultKernel); cfg.Kernel == "" && err == nil {
		cfg.Kernel = DefaultKernel
	}
	if cfg.Busybox == "" {
		cfg.Busybox = "/bin/busybox"
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if cfg.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("vm driver: %w", err)
		}
		cfg.Binary = exe
	}
	root, err := filepath.Abs(filepath.Join(cfg.Data, "vm"))
	if err != nil {
		return nil, fmt.Errorf("vm driver: %w", err)
	}
	d := &Driver{cfg: cfg, root: root}
	go warmQEMU(cfg.QEMU) // check.go: the first suspend does not wait for QEMU's answers
	d.images = images{dir: filepath.Join(root, "images"), busybox: cfg.Busybox, modules: modulesDir(cfg.Kernel)}
	return d, nil
}

// Missing says what the node lacks to run a VM (QEMU, the kernel,
// busybox), or nil.
func (d *Driver) Missing() error {
	var miss []string
	if _, err := exec.LookPath(d.cfg.QEMU); err != nil {
		miss = append(miss, fmt.Sprintf("QEMU (%s: %v; Debian's qemu-system-x86)", d.cfg.QEMU, err))
	}
	switch {
	case d.cfg.Kernel == "":
		miss = append(miss, "a guest kernel (torpor serve --vm-kernel PATH or $"+KernelEnv+"; deploy/vm-kernel fetches Debian's cloud kernel)")
	default:
		if _, err := os.Stat(d.cfg.Kernel); err != nil {
			miss = append(miss, fmt.Sprintf("the guest kernel (%v)", err))
		}
	}
	if _, err := os.Stat(d.cfg.Busybox); err != nil {
		miss = append(miss, fmt.Sprintf("a static busybox for the guest (%v; Debian's busybox-static)", err))
	}
	if len(miss) == 0 {
		return nil
	}
	return events.Errorf(events.CodeFailedPrecondition, "the vm driver cannot run here: missing %s", strings.Join(miss, "; "))
}

// Capabilities: suspend to a snapshot; resume on another node where the
// node has an object store to move snapshots through.
func (d *Driver) Capabilities(map[string]string) compute.Capabilities {
	caps := compute.Capabilities{Suspend: true, ResumeElsewhere: d.cfg.Snapshots != nil, Retains: "the microVM's memory and devices, in a snapshot", RetainedSize: true}
	caps.Accelerator, caps.AcceleratorWhy = d.accelKnown()
	return caps
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateSpec refuses a create the driver cannot run: unknown options,
// memory or cpus out of range, no command, an environment sh cannot
// export; and, FAILED_PRECONDITION, a node without QEMU, the kernel or
// busybox.
func (d *Driver) ValidateSpec(spec compute.Spec) error {
	if _, _, err := shape(spec.Options); err != nil {
		return err
	}
	if len(spec.Command) == 0 || spec.Command[0] == "" {
		return errors.New("the vm driver runs a command in the guest: give one (\"command\": [\"prog\", \"arg\", …])")
	}
	for k, v := range spec.Env {
		if !envName.MatchString(k) || strings.ContainsRune(v, 0) {
			return fmt.Errorf("env %q: a name must be letters, digits and '_' (not first a digit), a value without NUL", k)
		}
	}
	for _, a := range spec.Command {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("command argument %q holds a NUL", a)
		}
	}
	return d.Missing()
}

// shape is the VM's memory (MiB) and CPUs from the driver options.
func shape(opts map[string]string) (memory, cpus int, err error) {
	memory, cpus = DefaultMemory, DefaultCPUs
	for k, v := range opts {
		switch k {
		case "memory":
			n, err := strconv.Atoi(v)
			if err != nil || n < MinMemory || n > MaxMemory {
				return 0, 0, fmt.Errorf("vm driver option memory=%q: want MiB from %d to %d", v, MinMemory, MaxMemory)
			}
			memory = n
		case "cpus":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxCPUs {
				return 0, 0, fmt.Errorf("vm driver option cpus=%q: want 1 to %d", v, MaxCPUs)
			}
			cpus = n
		default:
			return 0, 0, fmt.Errorf("vm driver option %q: known options are memory and cpus", k)
		}
	}
	return memory, cpus, nil
}

// Accelerator is the accelerator new VMs get and why (KVM where a probe
// boots under it, else TCG).
func (d *Driver) Accelerator(ctx context.Context) (string, string) {
	m := machine{QEMU: d.cfg.QEMU, Kernel: d.cfg.Kernel}
	if err := d.images.load(); err == nil {
		if img, err := d.images.image(compute.Spec{Command: []string{"true"}}); err == nil {
			m.Initrd = img
		}
	}
	return d.accel.pick(ctx, d.cfg.Accel, m, filepath.Join(d.root, ".probe"), d.cfg.Log)
}

// dir is sandbox id's directory, or an error for an id that is no file name.
func (d *Driver) dir(id string) (string, error) {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, `/\`) || strings.HasPrefix(id, ".") || id == "images" {
		return "", fmt.Errorf("sandbox id %q is no file name: %w", id, compute.ErrRejected)
	}
	return filepath.Join(d.root, id), nil
}

func load(dir string) (*state, error) {
	var st state
	err := supervisor.ReadJSON(filepath.Join(dir, stateFile), &st)
	if supervisor.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &st, nil
}

func save(dir string, st *state) error {
	return supervisor.WriteJSON(filepath.Join(dir, stateFile), st)
}

func loadRun(dir string) (run, error) {
	var r run
	if err := supervisor.ReadJSON(filepath.Join(dir, runFile), &r); err != nil && !supervisor.IsNotExist(err) {
		return run{}, err
	}
	return r, nil
}

// open takes sandbox id's lock and reads its state (nil if it has none).
func (d *Driver) open(id string) (dir string, st *state, unlock func(), err error) {
	if dir, err = d.dir(id); err != nil {
		return "", nil, func() {}, err
	}
	unlock = d.locks.Lock(id)
	if st, err = load(dir); err != nil {
		unlock()
		return "", nil, func() {}, err
	}
	return dir, st, unlock, nil
}

// machine is the VM of spec in dir with its memory in ram.
func (d *Driver) machine(ctx context.Context, dir string, spec compute.Spec, ram string) (machine, error) {
	memory, cpus, err := shape(spec.Options)
	if err != nil {
		return machine{}, fmt.Errorf("%w: %w", compute.ErrRejected, err)
	}
	if err := d.Missing(); err != nil {
		return machine{}, fmt.Errorf("%w: %w", compute.ErrRejected, err)
	}
	if err := d.images.runs(spec.Command); err != nil {
		return machine{}, err
	}
	img, err := d.images.image(spec)
	if err != nil {
		return machine{}, err
	}
	kind, _ := d.Accelerator(ctx)
	return machine{
		QEMU: d.cfg.QEMU, Kernel: d.cfg.Kernel, Initrd: img,
		RAM: filepath.Join(dir, ram), Console: filepath.Join(dir, consoleFile),
		Memory: memory, CPUs: cpus, Accel: kind,
		QMP: filepath.Join(dir, qmpSocket), SupervisorQMP: filepath.Join(dir, supSocket),
	}, nil
}

// Start boots the generation's VM under a new supervisor and returns once
// QEMU runs (the supervisor attaches when the guest's init is ready). A
// command the guest does not have is refused at once. A repeated Start of
// the same generation answers as the first did; one of an older generation
// does nothing.
func (d *Driver) Start(ctx context.Context, req compute.Start) error {
	defer func() { go d.refillSpare() }() // a supervisor ahead for what follows (spare.go)
	id, gen := req.Spec.SandboxID, req.Generation
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	switch {
	case st != nil && gen < st.Generation:
		return nil
	case st != nil && gen == st.Generation && st.Failed != "":
		return fmt.Errorf("start %s generation %d: %w: %s", id, gen, compute.ErrRejected, st.Failed)
	case st != nil && gen == st.Generation && st.Supervisor.Pid != 0:
		return nil
	case st != nil:
		if err := d.end(ctx, dir, st); err != nil {
			return fmt.Errorf("start %s generation %d: end generation %d: %w", id, gen, st.Generation, err)
		}
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	ram := "ram-" + strconv.FormatInt(gen, 10)
	m, err := d.machine(ctx, dir, req.Spec, ram)
	if err != nil {
		if errors.Is(err, compute.ErrRejected) {
			why := strings.TrimPrefix(err.Error(), compute.ErrRejected.Error()+": ")
			if serr := save(dir, &state{Generation: gen, Failed: why}); serr != nil {
				return errors.Join(err, serr)
			}
		}
		return fmt.Errorf("start %s generation %d: %w", id, gen, err)
	}
	next := &state{Generation: gen, RAM: ram, Accel: m.Accel}
	if st != nil {
		next.Suspension, next.Consumed = st.Suspension, st.Consumed
		if next.Suspension != nil && next.Suspension.Held {
			// A cold start over a held snapshot: the start discards it.
			d.removeSnapshot(ctx, dir, next.Suspension)
			next.Suspension.Held = false
		}
	}
	if err := save(dir, next); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := freshRAM(m.RAM, m.Memory); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := supervisor.WriteJSON(filepath.Join(dir, machineFile), m); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	sup, err := d.spawn(ctx, dir, id, gen, req.Credential, req.BusCreds, false)
	if err != nil {
		return fmt.Errorf("start %s generation %d: %w", id, gen, err)
	}
	r, err := loadRun(dir)
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	next.Supervisor, next.QEMU = sup, r.QEMU
	return save(dir, next)
}

// spawn starts `torpor supervise --vm` for generation gen
// (supervisor.Spawn) and waits until it says QEMU runs.
func (d *Driver) spawn(ctx context.Context, dir, id string, gen int64, cred, busCreds string, restore bool) (supervisor.Proc, error) {
	if sup, err := d.giveSpare(ctx, Job{Sandbox: id, Generation: gen, Dir: dir, Restore: restore, Credential: cred, BusCreds: busCreds}); !errors.Is(err, errNoSpare) {
		return sup, err
	}
	args := []string{d.cfg.Binary, "supervise", "--vm",
		"--sandbox", id,
		"--generation", strconv.FormatInt(gen, 10),
		"--nats-url", d.cfg.NATSURL,
		"--nats-ca", d.cfg.NATSCA,
		"--dir", dir,
		"--heartbeat", d.cfg.Heartbeat.String(),
		"--ready-fd", strconv.Itoa(supervisor.ReadyFD),
	}
	if restore {
		args = append(args, "--restore")
	}
	env := []string{"PATH=" + os.Getenv("PATH"), supervisor.CredentialEnv + "=" + cred}
	if busCreds != "" {
		env = append(env, supervisor.BusCredsEnv+"="+busCreds)
	}
	sup, why, err := supervisor.Spawn(ctx, args, env, dir, filepath.Join(dir, logFile))
	if err == nil && why != "" {
		err = errors.New(why)
	}
	return sup, err
}

// end ends st's QEMU and waits until its supervisor is gone.
func (d *Driver) end(ctx context.Context, dir string, st *state) error {
	if st.QEMU.Alive() {
		if err := syscall.Kill(st.QEMU.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
	}
	return supervisor.Until(ctx, func() (bool, error) { return !st.QEMU.Alive() && !st.Supervisor.Alive(), nil })
}

// Stop powers the generation's VM off (QEMU is killed: the guest has no
// storage to flush), keeping the sandbox's directory. It is idempotent,
// and a Stop of another generation than the newest changes nothing.
func (d *Driver) Stop(ctx context.Context, t compute.Target) error {
	id := t.Spec.SandboxID
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	if st == nil || st.Generation != t.Generation {
		return nil
	}
	if !st.Stopped {
		st.Stopped = true
		if s := st.Suspension; s != nil && s.Held && s.Generation == st.Generation {
			d.removeSnapshot(ctx, dir, s)
			s.Held = false
		}
		if err := save(dir, st); err != nil {
			return fmt.Errorf("stop %s: %w", id, err)
		}
	}
	if err := d.end(ctx, dir, st); err != nil {
		return fmt.Errorf("stop %s generation %d: %w", id, t.Generation, err)
	}
	return nil
}

// Suspend snapshots the generation's VM and ends its QEMU: the guest is
// stopped, its device state migrated to a file (the RAM stays in the RAM
// file: x-ignore-shared), the file renamed into place once the migration
// completed, the suspension recorded, then QEMU quits. The reference names
// the snapshot and its digest. A repeated Suspend of the generation returns
// the same reference. A guest whose workload exited first is no suspension
// (ErrRejected): the exit is reported with its code.
func (d *Driver) Suspend(ctx context.Context, t compute.Target) (string, error) {
	id, gen := t.Spec.SandboxID, t.Generation
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return "", fmt.Errorf("suspend %s: %w", id, err)
	}
	if st == nil {
		return "", fmt.Errorf("suspend %s generation %d: %w: no such sandbox here", id, gen, compute.ErrRejected)
	}
	if s := st.Suspension; s != nil && s.Generation == gen && (s.Held || st.Consumed != nil && st.Consumed.Ref == s.Ref) {
		if st.Generation == gen {
			if err := d.end(ctx, dir, st); err != nil {
				return "", fmt.Errorf("suspend %s generation %d: %w", id, gen, err)
			}
		}
		return s.Ref, nil
	}
	if gen != st.Generation || st.Stopped || !st.QEMU.Alive() {
		return "", fmt.Errorf("suspend %s generation %d: %w: the VM of that generation is not running", id, gen, compute.ErrRejected)
	}
	if r, _ := loadRun(dir); r.Generation == gen && r.Exited {
		return "", fmt.Errorf("suspend %s generation %d: %w: the workload exited (code %d)", id, gen, compute.ErrRejected, r.Code)
	}
	s, err := d.snapshot(ctx, dir, st, t.Spec)
	if err != nil {
		d.resumeGuest(dir)
		if r, _ := loadRun(dir); (r.Generation == gen && r.Exited) || !st.QEMU.Alive() {
			err = fmt.Errorf("%w: the workload ended: %w", compute.ErrRejected, err)
		}
		return "", fmt.Errorf("suspend %s generation %d: %w", id, gen, err)
	}
	s.Compat = d.compatOf(ctx, st, t.Spec, s) // what a node restoring it needs (check.go)
	// The suspension first: the supervisor that sees QEMU end reads it,
	// and reports no exit.
	st.Suspension = s
	if err := save(dir, st); err != nil {
		d.resumeGuest(dir)
		return "", fmt.Errorf("suspend %s: %w", id, err)
	}
	if mo, err := dial(ctx, filepath.Join(dir, qmpSocket)); err == nil {
		_, _ = mo.run("quit", nil)
		mo.close()
	}
	if err := d.end(ctx, dir, st); err != nil {
		return "", fmt.Errorf("suspend %s generation %d: %w", id, gen, err)
	}
	d.exportAhead(id, dir, s)
	return s.Ref, nil
}

// snapshot stops the guest and migrates its device state to a new file.
func (d *Driver) snapshot(ctx context.Context, dir string, st *state, spec compute.Spec) (*suspension, error) {
	mo, err := dial(ctx, filepath.Join(dir, qmpSocket))
	if err != nil {
		return nil, err
	}
	defer mo.close()
	if err := mo.ignoreShared(); err != nil {
		return nil, err
	}
	if _, err := mo.run("stop", nil); err != nil {
		return nil, err
	}
	// A migration an interrupted suspend left half written is of no use.
	if stale, _ := filepath.Glob(filepath.Join(dir, ".snap-*.tmp")); len(stale) > 0 {
		for _, f := range stale {
			_ = os.Remove(f)
		}
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("snap-%d-%s.state", st.Generation, hex.EncodeToString(b[:]))
	tmp := filepath.Join(dir, "."+name+".tmp")
	if _, err := mo.run("migrate", map[string]any{"uri": "exec:cat > " + shellPath(tmp)}); err != nil {
		return nil, err
	}
	err = supervisor.Until(ctx, func() (bool, error) {
		status, why, err := mo.migration()
		switch {
		case err != nil:
			return false, err
		case status == "failed" || status == "cancelled":
			return false, fmt.Errorf("migration %s: %s", status, why)
		}
		return status == "completed", nil
	})
	if err != nil {
		os.Remove(tmp)
		return nil, err
	}
	digest, size, err := syncDigest(tmp)
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return nil, err
	}
	// Only the newest snapshot is held: one an interrupted suspend renamed
	// into place but never recorded is dropped.
	if others, _ := filepath.Glob(filepath.Join(dir, "snap-*.state")); len(others) > 1 {
		for _, f := range others {
			if filepath.Base(f) != name {
				_ = os.Remove(f)
			}
		}
	}
	ramSize, _ := allocated(filepath.Join(dir, st.RAM))
	ref := fmt.Sprintf("vm:%s:%s:%s:%s", spec.Node, spec.SandboxID, strings.TrimSuffix(name, ".state"), digest)
	return &suspension{Generation: st.Generation, Ref: ref, Held: true, State: name, RAM: st.RAM, Digest: digest, Size: size + ramSize}, nil
}

// settle finishes what a driver that died in the middle of a suspend or a
// resume of st's generation left (a driver that lives does all of this
// under the sandbox's lock, which settle holds too):
//   - a QEMU still there behind a recorded suspension quits: the snapshot
//     was whole when it was recorded, and the sandbox is frozen;
//   - a guest left paused, by a suspend that stopped it but recorded
//     nothing, or by a resume that recorded its consumption but never
//     continued it, runs on, once a migration still under way is cancelled
//     and its half-written file removed (a suspend again makes a new one).
//
// A guest that runs, or no QEMU, is left as it is.
func (d *Driver) settle(ctx context.Context, dir string, st *state) error {
	if !st.QEMU.Alive() {
		return nil
	}
	mo, err := dial(ctx, filepath.Join(dir, qmpSocket))
	if err != nil {
		return fmt.Errorf("the monitor of QEMU %d: %w", st.QEMU.Pid, err)
	}
	defer mo.close()
	if _, held := st.held(); held {
		_, _ = mo.run("quit", nil)
		return d.end(ctx, dir, st)
	}
	status, err := mo.status()
	if err != nil {
		return err
	}
	switch status {
	case "paused", "finish-migrate", "postmigrate":
	default:
		return nil
	}
	_, _ = mo.run("migrate_cancel", nil)
	err = supervisor.Until(ctx, func() (bool, error) {
		status, _, err := mo.migration()
		switch status {
		case "setup", "active", "device", "pre-switchover", "cancelling", "wait-unplug":
			return false, err
		}
		return true, err
	})
	if err != nil {
		return err
	}
	if stale, _ := filepath.Glob(filepath.Join(dir, ".snap-*.tmp")); len(stale) > 0 {
		for _, f := range stale {
			_ = os.Remove(f)
		}
	}
	_, err = mo.run("cont", nil)
	return err
}

// resumeGuest continues a guest a failed suspend stopped, if QEMU is there.
func (d *Driver) resumeGuest(dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if mo, err := dial(ctx, filepath.Join(dir, qmpSocket)); err == nil {
		_, _ = mo.run("cont", nil)
		mo.close()
	}
}

// syncDigest syncs the file at path and returns its SHA-256 and size.
func syncDigest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err == nil {
		err = f.Sync()
	}
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// allocated is the bytes the file at path takes on disk (a RAM file is sparse).
func allocated(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		return s.Blocks * 512, nil
	}
	return fi.Size(), nil
}

// removeSnapshot removes the files of s and its object, if it was exported.
func (d *Driver) removeSnapshot(ctx context.Context, dir string, s *suspension) {
	d.dropExport(ctx, filepath.Base(dir))
	if s.State != "" {
		_ = os.Remove(filepath.Join(dir, s.State))
	}
	if s.RAM != "" {
		_ = os.Remove(filepath.Join(dir, s.RAM))
	}
	if s.Exported != "" && d.cfg.Snapshots != nil {
		if o, err := parseObjectRef(s.Exported); err == nil {
			_ = d.cfg.Snapshots.Delete(ctx, o.name)
		}
	}
	if s.State != "" && d.cfg.Snapshots != nil {
		// An export ahead a restarted driver never recorded.
		_ = d.cfg.Snapshots.Delete(ctx, objectName(filepath.Base(dir), s))
	}
}

// Resume restores the snapshot behind req.RestoreRef under the new
// generation: a new supervisor starts QEMU waiting for the snapshot, the
// driver feeds it the device state (the RAM file is mapped back) and
// continues the guest, and the supervisor attaches as the new generation
// once it runs. A reference of another node's snapshot (exported to the
// object store) is fetched first and its digest checked. Whatever fails
// before the guest is continued leaves the snapshot held (not consumed); a
// guest that dies after it was continued is a failure after consumption. A
// repeated Resume of the same (generation, reference) answers as the first
// did.
func (d *Driver) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	id, gen, ref := req.Spec.SandboxID, req.Generation, req.RestoreRef
	none := compute.ResumeResult{}
	consumed := compute.ResumeResult{Consumed: true}
	began := time.Now() // the restore started (README "Resume latency")
	// Once the guest runs, a supervisor ahead for the next (spare.go).
	defer func() { go d.refillSpare() }()
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return none, fmt.Errorf("resume %s: %w", id, err)
	}
	if st != nil {
		if c := st.Consumed; c != nil && c.Ref == ref {
			switch {
			case c.Generation != gen:
				return none, fmt.Errorf("resume %s: %w: %s was consumed by generation %d", id, compute.ErrUnknownRef, ref, c.Generation)
			case c.Failed || (st.Generation == gen && !st.QEMU.Alive() && !st.Stopped):
				return consumed, fmt.Errorf("resume %s generation %d: %s was consumed, and the restored guest died", id, gen, ref)
			}
			if st.Generation == gen {
				// An attempt that died before it continued the guest left it
				// paused.
				if err := d.settle(ctx, dir, st); err != nil {
					return consumed, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
				}
			}
			return consumed, nil
		}
	}
	var s *suspension
	var fetched func() error // the rest of a streamed fetch (streamed.go)
	if o, err := parseObjectRef(ref); err == nil {
		var rest func() error
		if s, rest, err = d.fetchStreamed(ctx, dir, req, o); err != nil {
			return none, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
		}
		defer rest() // the fetch ends before Resume does, whatever happens
		fetched = rest
		if st == nil {
			st = &state{}
		}
	} else {
		if st == nil {
			return none, fmt.Errorf("resume %s: %w: %q", id, compute.ErrUnknownRef, ref)
		}
		held, ok := st.held()
		if !ok || held != ref {
			return none, fmt.Errorf("resume %s: %w: %q", id, compute.ErrUnknownRef, ref)
		}
		if err := d.stopExport(ctx, id, dir, st); err != nil {
			return none, fmt.Errorf("resume %s: %w", id, err)
		}
		s = st.Suspension
		if digest, _, err := syncDigest(filepath.Join(dir, s.State)); err != nil || digest != s.Digest {
			return none, fmt.Errorf("resume %s generation %d: the snapshot's device state does not match its digest (%v): not restored", id, gen, err)
		}
	}
	// What is left of an earlier attempt of this resume ends first: the
	// last generation's QEMU, and a restoring supervisor (and its QEMU) of
	// an attempt whose driver died before it recorded anything. Its guest
	// was never continued (the consumption is recorded before that), so the
	// snapshot is whole.
	if err := d.end(ctx, dir, st); err != nil {
		return none, fmt.Errorf("resume %s: %w", id, err)
	}
	if err := d.endAttempt(ctx, dir, gen); err != nil {
		return none, fmt.Errorf("resume %s: %w", id, err)
	}
	m, err := d.machine(ctx, dir, req.Spec, s.RAM)
	if err != nil {
		return none, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
	}
	if st.Accel != "" {
		m.Accel = st.Accel // the state restores only into the machine it came from
	}
	if err := supervisor.WriteJSON(filepath.Join(dir, machineFile), m); err != nil {
		return none, fmt.Errorf("resume %s: %w", id, err)
	}
	sup, qemu, err := d.restoreIncoming(ctx, dir, id, gen, req.Credential, req.BusCreds, s, fetched)
	if err != nil {
		if sup.Alive() {
			_ = syscall.Kill(sup.Pid, syscall.SIGKILL)
		}
		if qemu.Alive() {
			_ = syscall.Kill(qemu.Pid, syscall.SIGKILL)
		}
		return none, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
	}
	// The point of no return: continued, the guest changes its RAM file.
	if st.Suspension != nil && st.Suspension.Ref == ref {
		st.Suspension.Held = false
	}
	st.Consumed = &consumption{Ref: ref, Generation: gen}
	st.Generation, st.Supervisor, st.QEMU, st.RAM, st.Stopped, st.Failed, st.Accel = gen, sup, qemu, s.RAM, false, "", m.Accel
	if err := save(dir, st); err != nil {
		return none, fmt.Errorf("resume %s: %w", id, err)
	}
	if d.cfg.beforeCont != nil {
		if err := d.cfg.beforeCont(); err != nil {
			return none, err
		}
	}
	err = d.cont(ctx, dir, qemu)
	if err != nil {
		st.Consumed.Failed = true
		err = errors.Join(err, save(dir, st), d.end(ctx, dir, st))
		return consumed, fmt.Errorf("resume %s generation %d: the restored guest died: %w", id, gen, err)
	}
	consumed.RestoreStartedAt, consumed.RunningAt = began, time.Now() // cont answered: the guest runs
	_ = os.Remove(filepath.Join(dir, s.State))
	if s.Exported != "" && d.cfg.Snapshots != nil {
		if o, err := parseObjectRef(s.Exported); err == nil {
			_ = d.cfg.Snapshots.Delete(ctx, o.name) // restored here: the copy that could move is moot
		}
	}
	if o, err := parseObjectRef(ref); err == nil && d.cfg.Snapshots != nil {
		// Restored, the object is used up: nobody restores it twice.
		_ = d.cfg.Snapshots.Delete(ctx, o.name)
	}
	return consumed, nil
}

// endAttempt ends the supervisor of generation gen that run.json names, and
// its QEMU, if they run: what an interrupted attempt to resume gen left.
func (d *Driver) endAttempt(ctx context.Context, dir string, gen int64) error {
	r, err := loadRun(dir)
	if err != nil || r.Generation != gen {
		return err
	}
	left := &state{QEMU: r.QEMU}
	if sup, err := supervisor.ProcOf(r.Supervisor); err == nil {
		left.Supervisor = sup
		_ = syscall.Kill(sup.Pid, syscall.SIGKILL)
	}
	return d.end(ctx, dir, left)
}

// restoreIncoming starts a restoring supervisor and feeds its QEMU the
// snapshot's device state, up to a guest that is paused and whole; with
// fetched, once fetched says the snapshot is all there (a streamed fetch).
func (d *Driver) restoreIncoming(ctx context.Context, dir, id string, gen int64, cred, busCreds string, s *suspension, fetched func() error) (sup, qemu supervisor.Proc, err error) {
	_ = os.Remove(filepath.Join(dir, runFile))
	sup, err = d.spawn(ctx, dir, id, gen, cred, busCreds, true)
	if err != nil {
		return sup, qemu, err
	}
	r, err := loadRun(dir)
	if err != nil {
		return sup, qemu, err
	}
	qemu = r.QEMU
	mo, err := dial(ctx, filepath.Join(dir, qmpSocket))
	if err != nil {
		return sup, qemu, err
	}
	defer mo.close()
	if err := mo.ignoreShared(); err != nil {
		return sup, qemu, err
	}
	if fetched != nil {
		// QEMU started while the snapshot came: all of it is here, and
		// matches its digest, before any of it is taken.
		if err := fetched(); err != nil {
			return sup, qemu, err
		}
	}
	if err := feedIncoming(ctx, mo, dir, filepath.Join(dir, s.State)); err != nil {
		return sup, qemu, err
	}
	err = supervisor.Until(ctx, func() (bool, error) {
		if !qemu.Alive() {
			return false, errors.New("QEMU ended while it took the snapshot")
		}
		status, why, err := mo.migration()
		switch {
		case err != nil:
			return false, err
		case status == "failed" || status == "cancelled":
			return false, fmt.Errorf("incoming migration %s: %s", status, why)
		}
		return status == "completed", nil
	})
	return sup, qemu, err
}

// cont continues the restored guest and checks it runs.
func (d *Driver) cont(ctx context.Context, dir string, qemu supervisor.Proc) error {
	mo, err := dial(ctx, filepath.Join(dir, qmpSocket))
	if err != nil {
		return err
	}
	defer mo.close()
	if _, err := mo.run("cont", nil); err != nil {
		return err
	}
	if d.cfg.afterCont != nil {
		d.cfg.afterCont(qemu.Pid)
	}
	status, err := mo.status()
	switch {
	case err != nil:
		return err
	case status != "running":
		return fmt.Errorf("the guest is %s after cont", status)
	case !qemu.Alive():
		return errors.New("QEMU ended")
	}
	return nil
}

// Discard removes the snapshot behind ref (and its object): a start of a
// suspended sandbox is a cold one. On a node the sandbox moved away from,
// nothing of it is left. It is idempotent.
func (d *Driver) Discard(ctx context.Context, spec compute.Spec, ref string) error {
	id := spec.SandboxID
	if o, err := parseObjectRef(ref); err == nil {
		if d.cfg.Snapshots != nil {
			if err := d.cfg.Snapshots.Delete(ctx, o.name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
				return fmt.Errorf("discard %s: %w", id, err)
			}
		}
		return nil
	}
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return fmt.Errorf("discard %s: %w", id, err)
	}
	if st == nil || st.Suspension == nil || st.Suspension.Ref != ref {
		return nil
	}
	moved := st.Suspension.Moving
	if st.Suspension.Held {
		d.removeSnapshot(ctx, dir, st.Suspension)
		st.Suspension.Held = false
		st.Stopped = st.Stopped || st.Suspension.Generation == st.Generation
		if err := save(dir, st); err != nil {
			return fmt.Errorf("discard %s: %w", id, err)
		}
	}
	if moved && !st.QEMU.Alive() && !st.Supervisor.Alive() {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("discard %s: %w", id, err)
		}
	}
	return nil
}

// Delete ends the sandbox's VM and supervisor, removes its directory, and
// deletes every snapshot object of it. It is idempotent.
func (d *Driver) Delete(ctx context.Context, spec compute.Spec) error {
	id := spec.SandboxID
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	if st != nil {
		if st.Supervisor.Alive() {
			_ = syscall.Kill(st.Supervisor.Pid, syscall.SIGKILL)
		}
		if err := d.end(ctx, dir, st); err != nil {
			return fmt.Errorf("delete %s: %w", id, err)
		}
	}
	d.dropExport(ctx, id)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	if err := d.deleteObjects(ctx, id); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	return nil
}

// Observe says what is true of the sandbox's newest generation: running,
// frozen (suspended behind its snapshot), stopped, exited with the code its
// supervisor recorded, or gone, and the reference the newest resume
// consumed, with its generation. How names the accelerator. What a driver
// that died in the middle of a suspend or a resume left is settled first
// (settle), so that a guest said to run does run and one said frozen has
// no QEMU left.
func (d *Driver) Observe(ctx context.Context, spec compute.Spec) (compute.Observation, error) {
	id := spec.SandboxID
	if _, err := d.dir(id); err != nil {
		return compute.Observation{State: compute.StateGone}, nil
	}
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return compute.Observation{}, fmt.Errorf("observe %s: %w", id, err)
	}
	if st == nil {
		return compute.Observation{State: compute.StateGone}, nil
	}
	if err := d.settle(ctx, dir, st); err != nil {
		return compute.Observation{}, fmt.Errorf("observe %s: %w", id, err)
	}
	o := compute.Observation{Generation: st.Generation, How: "snapshot, " + st.Accel}
	if c := st.Consumed; c != nil {
		o.Consumed, o.ConsumedGeneration = c.Ref, c.Generation
	}
	if ref, held := st.held(); held {
		if _, err := os.Stat(filepath.Join(dir, st.Suspension.State)); err == nil && !st.QEMU.Alive() {
			o.State, o.RestoreRef, o.RetainedBytes = compute.StateFrozen, ref, st.Suspension.Size
			return o, nil
		}
	}
	if st.QEMU.Alive() {
		o.State = compute.StateRunning
		return o, nil
	}
	o.State = compute.StateStopped
	if st.Stopped {
		return o, nil
	}
	r, err := loadRun(dir)
	if err != nil {
		return compute.Observation{}, fmt.Errorf("observe %s: %w", id, err)
	}
	if r.Exited && r.Generation == st.Generation {
		o.State, o.ExitCode = compute.StateExited, r.Code
	}
	return o, nil
}

// Logs returns the last tail lines of the guest's console.
func (d *Driver) Logs(ctx context.Context, spec compute.Spec, tail int) ([]byte, error) {
	dir, err := d.dir(spec.SandboxID)
	if err != nil {
		return nil, nil
	}
	b, err := supervisor.LastLines(filepath.Join(dir, consoleFile), tail)
	if err != nil {
		return nil, fmt.Errorf("logs %s: %w", spec.SandboxID, err)
	}
	return b, nil
}
