package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/supervisor"
)

var (
	_ compute.Driver        = (*Driver)(nil)
	_ compute.Suspender     = (*Driver)(nil)
	_ compute.Observer      = (*Driver)(nil)
	_ compute.Logger        = (*Driver)(nil)
	_ compute.Dialer        = (*Driver)(nil)
	_ compute.SpecValidator = (*Driver)(nil)
)

// Config says where the driver keeps its sandboxes and how it runs them.
type Config struct {
	// Data is the service's data directory; sandbox id lives in
	// <Data>/process/<id>.
	Data string
	// NATSURL is where the supervisors report (torpor serve's NATS).
	NATSURL string
	// NATSCA is a PEM file of the CAs a supervisor trusts for a NATS
	// server with TLS (supervise --nats-ca); empty: the system's.
	NATSCA string
	// Binary is the torpor executable the supervisors run; default
	// os.Executable().
	Binary string
	// Freezer forces a freezer (FreezerV2, FreezerV1, FreezerSignal) for
	// the sandboxes this driver starts; empty picks the first of them that
	// works here. A sandbox keeps the freezer it started with.
	Freezer string
	// Grace is how long a stop waits after SIGTERM before SIGKILL; default 2s.
	Grace time.Duration
	// Heartbeat is how often supervisors heartbeat; default 5s.
	Heartbeat time.Duration
	// Path is the PATH workloads get, and where a command without a slash
	// is looked for; default defaultPath (serve passes its own PATH).
	Path string
	// RunAs is whom the workloads run as (LookupUser: a user name, a uid
	// or uid:gid), with no supplementary groups; their supervisors stay
	// the service's user. Empty: the workloads run as the service's user.
	RunAs string
}

// defaultPath is the workloads' PATH when Config.Path is empty.
const defaultPath = "/usr/local/bin:/usr/bin:/bin"

// Validate reports the first field c cannot work with.
func (c Config) Validate() error {
	switch {
	case c.Data == "":
		return errors.New("process driver: no data directory")
	case c.NATSURL == "":
		return errors.New("process driver: no NATS URL for the supervisors")
	case c.Grace < 0:
		return fmt.Errorf("process driver: grace %s is negative", c.Grace)
	case c.Heartbeat < 0:
		return fmt.Errorf("process driver: heartbeat %s is negative", c.Heartbeat)
	}
	if c.Freezer != "" && !slices.Contains(freezers, c.Freezer) {
		return fmt.Errorf("process driver: unknown freezer %q (known: %s)", c.Freezer, strings.Join(freezers, ", "))
	}
	if c.RunAs != "" {
		if _, err := LookupUser(c.RunAs); err != nil {
			return fmt.Errorf("process driver: %w", err)
		}
	}
	return nil
}

// Driver is the process driver. It holds nothing in memory that matters:
// everything it knows of a sandbox is in the sandbox's directory, so a
// Driver made on the data directory of an earlier one (a restarted service)
// carries on with its sandboxes, running or frozen.
type Driver struct {
	cfg  Config
	root string // <Data>/process, absolute
	as   *User  // whom the workloads run as (Config.RunAs); nil: the service's user

	pick    sync.Once
	kind    string // the freezer new sandboxes get
	parent  string // where their cgroups are made
	pickErr error

	locks supervisor.Locks
}

// New returns a process driver over cfg. It starts nothing and touches no
// cgroup until a sandbox starts.
func New(cfg Config) (*Driver, error) {
	if cfg.Grace == 0 {
		cfg.Grace = 2 * time.Second
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 5 * time.Second
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("process driver: %w", err)
		}
		cfg.Binary = exe
	}
	root, err := filepath.Abs(filepath.Join(cfg.Data, "process"))
	if err != nil {
		return nil, fmt.Errorf("process driver: %w", err)
	}
	d := &Driver{cfg: cfg, root: root}
	if cfg.RunAs != "" {
		u, err := LookupUser(cfg.RunAs)
		if err != nil {
			return nil, fmt.Errorf("process driver: %w", err)
		}
		d.as = &u
	}
	return d, nil
}

// Freezer is the freezer new sandboxes get (Config.Freezer, or the first
// that works here), or why none of those asked for works.
func (d *Driver) Freezer() (string, error) {
	d.pick.Do(func() {
		kinds := freezers
		if d.cfg.Freezer != "" {
			kinds = []string{d.cfg.Freezer}
		}
		var errs []error
		for _, k := range kinds {
			parent, err := parentOf(k)
			if err == nil {
				d.kind, d.parent = k, parent
				return
			}
			errs = append(errs, err)
		}
		d.pickErr = errors.Join(errs...)
	})
	return d.kind, d.pickErr
}

// Capabilities: suspend, in place.
func (d *Driver) Capabilities(map[string]string) compute.Capabilities {
	return compute.Capabilities{Suspend: true, Retains: "the process group, frozen in place"}
}

// ValidateSpec refuses a create with any option (the process driver has
// none), with no command to run, or with an environment or command exec
// cannot take (an empty name, '=' in a name, a NUL anywhere). Whether the command is found is the
// start's to say, on its node, with the workload's PATH.
func (d *Driver) ValidateSpec(spec compute.Spec) error {
	for k := range spec.Options {
		return fmt.Errorf("process driver option %q: the process driver takes no options", k)
	}
	if len(spec.Command) == 0 || spec.Command[0] == "" {
		return errors.New("the process driver runs a command: give one (\"command\": [\"prog\", \"arg\", …])")
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("env %q=%q: a name must be non-empty without '=' or NUL, a value without NUL", k, v)
		}
	}
	for _, a := range spec.Command {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("command argument %q holds a NUL", a)
		}
	}
	return nil
}

// dir is sandbox id's directory, or an error for an id that is no file name.
func (d *Driver) dir(id string) (string, error) {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, `/\`) {
		return "", fmt.Errorf("sandbox id %q is no file name: %w", id, compute.ErrRejected)
	}
	return filepath.Join(d.root, id), nil
}

// load reads the state of the sandbox in dir; nil if it has none.
func load(dir string) (*state, error) {
	var st state
	err := readJSON(filepath.Join(dir, stateFile), &st)
	if isNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &st, nil
}

// open takes sandbox id's lock and reads its state (nil if it has none),
// as every call but Observe begins; unlock releases the lock, and is safe
// to call when open failed.
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

func save(dir string, st *state) error { return writeJSON(filepath.Join(dir, stateFile), st) }

// loadRun reads the supervisor's record in dir; zero if there is none.
func loadRun(dir string) (run, error) {
	var r run
	if err := readJSON(filepath.Join(dir, runFile), &r); err != nil && !isNotExist(err) {
		return run{}, err
	}
	return r, nil
}

// group is the workload group of st.
func (st *state) group() (group, error) { return groupOf(st.Freezer, st.Cgroup, st.Workload.Pid) }

// Start runs the generation's command under a supervisor (torpor
// supervise), in the sandbox's working directory, and returns once the
// command runs. A command that is missing or not found is refused at once.
// A repeated Start of the same generation answers as the first did; a
// Start of an older generation than the newest does nothing.
func (d *Driver) Start(ctx context.Context, req compute.Start) error {
	id, gen := req.Spec.SandboxID, req.Generation
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	work := filepath.Join(dir, workDir)
	env := d.env(req.Spec, work)
	if err := lookPath(req.Spec.Command, env, work); err != nil {
		return fmt.Errorf("start %s generation %d: %w", id, gen, err)
	}
	switch {
	case st != nil && gen < st.Generation:
		return nil
	case st != nil && gen == st.Generation && st.Failed != "":
		return fmt.Errorf("start %s generation %d: %w: %s", id, gen, compute.ErrRejected, st.Failed)
	case st != nil && gen == st.Generation && st.Supervisor.Pid != 0:
		return nil
	case st != nil && gen == st.Generation:
		// The start of this generation was under way when the service
		// stopped: its supervisor may have started, and said so.
		if r, err := loadRun(dir); err == nil && r.Generation == gen && r.Supervisor != 0 {
			st.Supervisor, st.Workload = proc{Pid: r.Supervisor}, r.Workload
			if sup, err := procOf(r.Supervisor); err == nil {
				st.Supervisor = sup
			}
			return save(dir, st)
		}
	case st != nil:
		// A newer generation: whatever is left of the older one ends.
		if err := d.end(ctx, dir, st, 0); err != nil {
			return fmt.Errorf("start %s generation %d: end generation %d: %w", id, gen, st.Generation, err)
		}
	}
	kind, err := d.Freezer()
	if err != nil {
		return fmt.Errorf("start %s: no freezer: %w", id, err)
	}
	if err := os.MkdirAll(work, 0o750); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := d.own(dir, work); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	cg, err := makeCgroup(ctx, kind, d.parent, id)
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	next := &state{Generation: gen, Freezer: kind, Cgroup: cg}
	if st != nil {
		next.Suspension, next.Consumed = st.Suspension, st.Consumed
		if next.Suspension != nil {
			next.Suspension.Held = false // its group ended above
		}
	}
	// The intent first: a restarted driver that finds it looks for the
	// supervisor before it starts another.
	if err := save(dir, next); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	sup, why, err := d.spawn(ctx, dir, cg, kind, req, env)
	switch {
	case err != nil:
		return fmt.Errorf("start %s generation %d: %w", id, gen, err)
	case why != "":
		next.Failed = why
		if err := save(dir, next); err != nil {
			return fmt.Errorf("start %s: %w", id, err)
		}
		return fmt.Errorf("start %s generation %d: %w: %s", id, gen, compute.ErrRejected, why)
	}
	r, err := loadRun(dir)
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	next.Supervisor, next.Workload = sup, r.Workload
	if err := save(dir, next); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	return nil
}

// own gives the workload's user (Config.RunAs) its working directory,
// work, and a way to it by its path (HOME): the directories above it, up
// to <Data>/process, may be passed through (0711), not listed, and every
// file of the driver and supervisor in them is 0600 (supervisor.WriteFile).
// Whether <Data> itself may be passed through is the service's to say.
func (d *Driver) own(dir, work string) error {
	if d.as == nil {
		return nil
	}
	for _, p := range []string{d.root, dir} {
		if err := os.Chmod(p, 0o711); err != nil {
			return err
		}
	}
	if err := os.Chown(work, d.as.UID, d.as.GID); err != nil {
		return err
	}
	return os.Chmod(work, 0o700)
}

// spawn starts `torpor supervise` for req (supervisor.Spawn) and waits
// until it says the command runs (why is empty) or why it does not.
func (d *Driver) spawn(ctx context.Context, dir, cg, kind string, req compute.Start, env []string) (sup proc, why string, err error) {
	args := []string{d.cfg.Binary, "supervise",
		"--sandbox", req.Spec.SandboxID,
		"--generation", strconv.FormatInt(req.Generation, 10),
		"--nats-url", d.cfg.NATSURL,
		"--nats-ca", d.cfg.NATSCA,
		"--dir", dir,
		"--heartbeat", d.cfg.Heartbeat.String(),
		"--freezer", kind,
		"--ready-fd", strconv.Itoa(supervisor.ReadyFD),
	}
	if cg != "" {
		args = append(args, "--cgroup", cg)
	}
	if d.as != nil {
		args = append(args, "--run-as", d.as.String())
	}
	args = append(append(args, "--"), req.Spec.Command...)
	env = append(env, CredentialEnv+"="+req.Credential)
	if req.BusCreds != "" {
		env = append(env, supervisor.BusCredsEnv+"="+req.BusCreds)
	}
	return supervisor.Spawn(ctx, args, env, dir, filepath.Join(dir, logFile))
}

// env is the environment of spec's workload: PATH (Config.Path), HOME (its
// working directory, work) and TORPOR_SANDBOX_ID, then the create request's env.
func (d *Driver) env(spec compute.Spec, work string) []string {
	path := d.cfg.Path
	if path == "" {
		path = defaultPath
	}
	vars := map[string]string{
		"PATH":              path,
		"HOME":              work,
		"TORPOR_SANDBOX_ID": spec.SandboxID,
	}
	for k, v := range spec.Env {
		vars[k] = v
	}
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

// lookPath checks that command names an executable, as the workload's exec
// will look for it: on the PATH of env, or relative to work.
func lookPath(command []string, env []string, work string) error {
	if len(command) == 0 || command[0] == "" {
		return fmt.Errorf("%w: no command", compute.ErrRejected)
	}
	name := command[0]
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			name = filepath.Join(work, name)
		}
		if _, err := exec.LookPath(name); err != nil {
			return fmt.Errorf("%w: command %s: %w", compute.ErrRejected, command[0], err)
		}
		return nil
	}
	var path string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue // the exec refuses what it finds relative to its directory
		}
		if _, err := exec.LookPath(filepath.Join(dir, name)); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: command %s: not found in PATH %s", compute.ErrRejected, name, path)
}

// Stop ends the generation's workload (SIGTERM, SIGKILL after the grace),
// keeping the sandbox's directory. It is idempotent, and a Stop of another
// generation than the newest changes nothing.
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
		if _, held := st.held(); held {
			st.Suspension.Held = false // its group ends now
		}
		if err := save(dir, st); err != nil {
			return fmt.Errorf("stop %s: %w", id, err)
		}
	}
	if err := d.end(ctx, dir, st, d.cfg.Grace); err != nil {
		return fmt.Errorf("stop %s generation %d: %w", id, t.Generation, err)
	}
	return nil
}

// end ends st's workload group: with a grace, SIGTERM first (thawed, so it
// can act on it) and SIGKILL once the grace is over; then it waits until
// every process of the group is gone and the supervisor has recorded the
// exit (or is gone too), so that a supervisor started next owns run.json.
func (d *Driver) end(ctx context.Context, dir string, st *state, grace time.Duration) error {
	if st.Workload.Pid == 0 {
		return nil
	}
	g, err := st.group()
	if err != nil {
		return err
	}
	if grace > 0 && st.Workload.Alive() {
		if err := g.thaw(ctx); err != nil && !isNotExist(err) {
			return err
		}
		if err := g.signal(syscall.SIGTERM); err != nil && !isNotExist(err) {
			return err
		}
		gctx, cancel := context.WithTimeout(ctx, grace)
		_ = until(gctx, func() (bool, error) { return !st.Workload.Alive(), nil })
		cancel()
	}
	err = until(ctx, func() (bool, error) {
		empty, err := g.empty()
		if isNotExist(err) || (err == nil && empty && !st.Workload.Alive()) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if err := g.kill(); err != nil && !isNotExist(err) {
			return false, err
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	return until(ctx, func() (bool, error) {
		if !st.Supervisor.Alive() {
			return true, nil
		}
		r, err := loadRun(dir)
		return r.Exited && r.Workload == st.Workload, err
	})
}

// Suspend freezes the generation's whole workload group in place and
// returns its restore reference once every process of it is frozen. A
// repeated Suspend of the generation returns the same reference.
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
	if s := st.Suspension; s != nil && s.Generation == gen {
		if _, held := st.held(); held && st.Workload.Alive() {
			if err := d.freeze(ctx, st); err != nil {
				return "", fmt.Errorf("suspend %s generation %d: %w", id, gen, err)
			}
		}
		return s.Ref, nil
	}
	if gen != st.Generation || st.Stopped || !st.Workload.Alive() {
		return "", fmt.Errorf("suspend %s generation %d: %w: the workload of that generation is not running", id, gen, compute.ErrRejected)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	ref := fmt.Sprintf("process:%s:%s:%d:%s", t.Spec.Node, id, gen, hex.EncodeToString(b[:]))
	// The reference first: Observe says frozen only of a group that is
	// frozen and has one.
	prev := st.Suspension
	st.Suspension = &suspension{Generation: gen, Ref: ref, Held: true}
	if err := save(dir, st); err != nil {
		return "", fmt.Errorf("suspend %s: %w", id, err)
	}
	if err := d.freeze(ctx, st); err != nil {
		st.Suspension = prev
		if g, gerr := st.group(); gerr == nil {
			tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = g.thaw(tctx)
			cancel()
		}
		if serr := save(dir, st); serr != nil {
			err = errors.Join(err, serr)
		}
		if !st.Workload.Alive() {
			err = fmt.Errorf("%w: the workload ended: %w", compute.ErrRejected, err)
		}
		return "", fmt.Errorf("suspend %s generation %d: %w", id, gen, err)
	}
	return ref, nil
}

func (d *Driver) freeze(ctx context.Context, st *state) error {
	g, err := st.group()
	if err != nil {
		return err
	}
	return g.freeze(ctx)
}

// Resume hands the supervisor of the frozen group behind req.RestoreRef
// the new generation and credential (Dir/handoff.json, then SIGUSR1), and
// thaws the group once the supervisor took them: it attaches as that
// generation, and reports as it from then on. A reference that is not the one held is ErrUnknownRef, not consumed.
// A group that died while frozen is found after the reference is consumed:
// the answer is then Consumed with an error. A repeated Resume of the same
// (generation, reference) answers as the first did.
func (d *Driver) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	id, gen, ref := req.Spec.SandboxID, req.Generation, req.RestoreRef
	none := compute.ResumeResult{}
	consumed := compute.ResumeResult{Consumed: true}
	began := time.Now() // the restore started (README "Resume latency")
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return none, fmt.Errorf("resume %s: %w", id, err)
	}
	if st == nil {
		return none, fmt.Errorf("resume %s: %w: %q", id, compute.ErrUnknownRef, ref)
	}
	if c := st.Consumed; c != nil && c.Ref == ref {
		switch {
		case c.Generation != gen:
			return none, fmt.Errorf("resume %s: %w: %s was consumed by generation %d", id, compute.ErrUnknownRef, ref, c.Generation)
		case c.Failed:
			return consumed, fmt.Errorf("resume %s generation %d: %s was consumed, and its group had died while frozen", id, gen, ref)
		}
		if st.Generation == gen && st.Workload.Alive() {
			if err := d.restore(ctx, dir, st, req); err != nil {
				return consumed, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
			}
		}
		return consumed, nil
	}
	if held, ok := st.held(); !ok || held != ref {
		return none, fmt.Errorf("resume %s: %w: %q", id, compute.ErrUnknownRef, ref)
	}
	st.Suspension.Held = false
	st.Consumed = &consumption{Ref: ref, Generation: gen}
	if !st.Workload.Alive() || !st.Supervisor.Alive() {
		st.Consumed.Failed = true
		err := save(dir, st)
		if err == nil {
			err = d.end(ctx, dir, st, 0) // a workload whose supervisor died goes too
		}
		return consumed, errors.Join(fmt.Errorf("resume %s generation %d: the group behind %s died while frozen", id, gen, ref), err)
	}
	// The consumption is recorded before the thaw: a re-driven resume that
	// finds it thaws and hands over again.
	st.Generation = gen
	if err := save(dir, st); err != nil {
		return none, fmt.Errorf("resume %s: %w", id, err)
	}
	if err := d.restore(ctx, dir, st, req); err != nil {
		return consumed, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
	}
	consumed.RestoreStartedAt, consumed.RunningAt = began, time.Now() // the thaw is done: the group runs
	return consumed, nil
}

// restore hands st's supervisor the generation of req, waits until it has
// taken it (its run.json says so), and only then thaws st's group: a
// workload that exits the moment it runs again is reported as the resumed
// generation, never as the one before, whose reports the gateway fences
// (issue 24, hole 6).
func (d *Driver) restore(ctx context.Context, dir string, st *state, req compute.Resume) error {
	g, err := st.group()
	if err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, handoffFile), handoff{Generation: req.Generation, Credential: req.Credential}); err != nil {
		return err
	}
	if !st.Supervisor.Alive() {
		return errors.New("the supervisor is gone")
	}
	if err := syscall.Kill(st.Supervisor.Pid, syscall.SIGUSR1); err != nil {
		return fmt.Errorf("hand over to the supervisor: %w", err)
	}
	err = until(ctx, func() (bool, error) {
		r, err := loadRun(dir)
		switch {
		case err != nil:
			return false, err
		case r.Supervisor == st.Supervisor.Pid && r.Generation >= req.Generation:
			return true, nil
		case r.Exited:
			return false, errors.New("the workload ended before the supervisor took the new generation")
		case !st.Supervisor.Alive():
			return false, errors.New("the supervisor is gone")
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("hand over to the supervisor: %w", err)
	}
	if err := g.thaw(ctx); err != nil {
		return fmt.Errorf("thaw: %w", err)
	}
	return nil
}

// Discard ends the frozen group behind ref: an explicit start of a
// suspended sandbox is a cold one. It is idempotent.
func (d *Driver) Discard(ctx context.Context, spec compute.Spec, ref string) error {
	id := spec.SandboxID
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return fmt.Errorf("discard %s: %w", id, err)
	}
	if st == nil || st.Suspension == nil || st.Suspension.Ref != ref {
		return nil
	}
	if st.Suspension.Held {
		st.Suspension.Held = false
		st.Stopped = st.Stopped || st.Suspension.Generation == st.Generation
		if err := save(dir, st); err != nil {
			return fmt.Errorf("discard %s: %w", id, err)
		}
	}
	if st.Suspension.Generation != st.Generation {
		return nil
	}
	if err := d.end(ctx, dir, st, 0); err != nil {
		return fmt.Errorf("discard %s: %w", id, err)
	}
	return nil
}

// Delete ends everything of the sandbox (its group, its supervisor) and
// removes its directory and cgroup. It is idempotent.
func (d *Driver) Delete(ctx context.Context, spec compute.Spec) error {
	id := spec.SandboxID
	dir, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	if st != nil {
		if err := d.end(ctx, dir, st, 0); err != nil {
			return fmt.Errorf("delete %s: %w", id, err)
		}
		if st.Supervisor.Alive() {
			if err := syscall.Kill(st.Supervisor.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("delete %s: end the supervisor: %w", id, err)
			}
			if err := until(ctx, func() (bool, error) { return !st.Supervisor.Alive(), nil }); err != nil {
				return fmt.Errorf("delete %s: %w", id, err)
			}
		}
		if err := removeCgroup(ctx, st.Cgroup); err != nil {
			return fmt.Errorf("delete %s: %w", id, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	return nil
}

// Observe says what is true of the sandbox's newest generation: running,
// frozen behind its reference, stopped, exited with the code its
// supervisor recorded, or gone (no directory); and the reference the newest
// resume consumed, with its generation.
func (d *Driver) Observe(ctx context.Context, spec compute.Spec) (compute.Observation, error) {
	id := spec.SandboxID
	dir, err := d.dir(id)
	if err != nil {
		return compute.Observation{State: compute.StateGone}, nil
	}
	st, err := load(dir)
	if err != nil {
		return compute.Observation{}, fmt.Errorf("observe %s: %w", id, err)
	}
	if st == nil {
		return compute.Observation{State: compute.StateGone}, nil
	}
	o := compute.Observation{Generation: st.Generation, How: st.Freezer}
	if c := st.Consumed; c != nil {
		o.Consumed, o.ConsumedGeneration = c.Ref, c.Generation
	}
	if st.Workload.Alive() {
		o.State = compute.StateRunning
		if ref, held := st.held(); held {
			g, err := st.group()
			if err != nil {
				return compute.Observation{}, fmt.Errorf("observe %s: %w", id, err)
			}
			if frozen, err := g.frozen(); err == nil && frozen {
				o.State, o.RestoreRef = compute.StateFrozen, ref
			}
		}
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
	if r.Exited && r.Workload == st.Workload && st.Workload.Pid != 0 {
		o.State, o.ExitCode = compute.StateExited, r.Code
	}
	return o, nil
}

// Logs returns the last tail lines of the workload's stdout, then the last
// tail lines of its stderr.
func (d *Driver) Logs(ctx context.Context, spec compute.Spec, tail int) ([]byte, error) {
	dir, err := d.dir(spec.SandboxID)
	if err != nil {
		return nil, nil
	}
	var out []byte
	for _, name := range []string{stdoutFile, stderrFile} {
		b, err := lastLines(filepath.Join(dir, name), tail)
		if err != nil {
			return nil, fmt.Errorf("logs %s: %w", spec.SandboxID, err)
		}
		out = append(out, b...)
	}
	return out, nil
}

// Dial connects to port of the sandbox: its workload's ports are the host's.
func (d *Driver) Dial(ctx context.Context, spec compute.Spec, port int) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("dial %s port %d: %w", spec.SandboxID, port, err)
	}
	return c, nil
}
