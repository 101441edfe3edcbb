package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/services/compute"
)

// Before a resume consumes anything, the node that is to restore a
// snapshot says whether it can (issue 29, compute.Checker): QEMU takes an
// incoming state only into the machine it came from, of a QEMU no older
// than the one that made it (and, for a machine type without a version,
// such as microvm, of the same release), under the same accelerator (and
// under KVM, a CPU of the same vendor), and the guest needs its memory and,
// when the snapshot is fetched from the object store, the disk to lay it
// out. What a snapshot needs is recorded with it at suspend (compat) and
// travels with its object as metadata.

var _ compute.Checker = (*Driver)(nil)

// machineType is the machine QEMU runs (machine.args: -M microvm,…).
const machineType = "microvm"

// compatKey is the object metadata key a movable snapshot's compat is
// kept under.
const compatKey = "torpor-compat"

// compat is what a snapshot needs of the node that restores it.
type compat struct {
	// QEMU is the version of the QEMU that made it ("7.2.22"), Machine the
	// machine type it ran.
	QEMU    string `json:"qemu,omitempty"`
	Machine string `json:"machine,omitempty"`
	// Accel is the accelerator it ran under; CPU, under KVM, the host CPU's
	// vendor (the guest saw its features).
	Accel string `json:"accel,omitempty"`
	CPU   string `json:"cpu,omitempty"`
	// Memory is the guest's memory (MiB).
	Memory int `json:"memory,omitempty"`
	// Bytes is what the snapshot takes on disk laid out (the device state
	// and the RAM file's allocated bytes).
	Bytes int64 `json:"bytes,omitempty"`
}

// host is what a node offers a restore.
type host struct {
	QEMU     string   // QEMU's version, "" if unknown
	Machines []string // its machine types, nil if unknown
	Accel    string   // the accelerator the restore would run under
	CPU      string   // the host CPU's vendor
	// FreeMemory and FreeDisk are in bytes, -1 when unknown.
	FreeMemory, FreeDisk int64
	Disk                 string // where FreeDisk was measured
}

// fits says why h cannot restore a snapshot that needs c, nil if it can;
// fetched: the snapshot is laid out here from the object store.
func (h host) fits(c compat, fetched bool) []string {
	var why []string
	if c.Machine != "" && h.Machines != nil && !slices.Contains(h.Machines, c.Machine) {
		why = append(why, fmt.Sprintf("the snapshot's machine type %s is not in QEMU %s here", c.Machine, h.QEMU))
	}
	if c.QEMU != "" && h.QEMU != "" {
		switch {
		case older(h.QEMU, c.QEMU):
			why = append(why, fmt.Sprintf("QEMU %s here is older than the snapshot's %s (QEMU restores no state of a newer release)", h.QEMU, c.QEMU))
		case !versioned(c.Machine) && release(h.QEMU) != release(c.QEMU):
			why = append(why, fmt.Sprintf("the snapshot's machine type %s has no version: QEMU %s here restores only a state of QEMU %s.x, not %s", c.Machine, h.QEMU, release(h.QEMU), c.QEMU))
		}
	}
	if c.Accel != "" && h.Accel != "" && c.Accel != h.Accel {
		why = append(why, fmt.Sprintf("the snapshot was made under %s; this node restores under %s", c.Accel, h.Accel))
	}
	if c.Accel == AccelKVM && c.CPU != "" && h.CPU != "" && c.CPU != h.CPU {
		why = append(why, fmt.Sprintf("the snapshot was made under KVM on a %s CPU; this node's is %s", c.CPU, h.CPU))
	}
	if need := int64(c.Memory) << 20; h.FreeMemory >= 0 && need > h.FreeMemory {
		why = append(why, fmt.Sprintf("the guest's %d MiB is more than the node's free memory (%d MiB available)", c.Memory, h.FreeMemory>>20))
	}
	if fetched && h.FreeDisk >= 0 && c.Bytes > h.FreeDisk {
		why = append(why, fmt.Sprintf("the snapshot takes %d MiB laid out; %d MiB free under %s", mib(c.Bytes), mib(h.FreeDisk), h.Disk))
	}
	return why
}

func mib(n int64) int64 { return (n + 1<<20 - 1) >> 20 }

// versionRe is a QEMU version, major.minor.micro.
var versionRe = regexp.MustCompile(`^(\d+)\.(\d+)(?:\.(\d+))?`)

// parts is version v's numbers (nil if it is none).
func parts(v string) []int {
	m := versionRe.FindStringSubmatch(v)
	if m == nil {
		return nil
	}
	out := make([]int, 3)
	for i := range out {
		out[i], _ = strconv.Atoi(m[i+1])
	}
	return out
}

// older says whether version a is older than b (false if either is none).
func older(a, b string) bool {
	pa, pb := parts(a), parts(b)
	if pa == nil || pb == nil {
		return false
	}
	return slices.Compare(pa, pb) < 0
}

// release is v's major.minor (v itself if it is no version).
func release(v string) string {
	p := parts(v)
	if p == nil {
		return v
	}
	return fmt.Sprintf("%d.%d", p[0], p[1])
}

// versioned says whether machine type m names a QEMU release (pc-q35-7.2),
// whose migration format later releases keep.
var versionedRe = regexp.MustCompile(`-\d+\.\d+$`)

func versioned(m string) bool { return versionedRe.MatchString(m) }

// qemuInfo is what a QEMU binary says of itself.
type qemuInfo struct {
	version  string
	machines []string
}

// qemuInfos caches qemuInfo per binary (its path, size and time).
var qemuInfos sync.Map

// probeQEMU asks binary qemu for its version and machine types, once per
// build of the binary.
func probeQEMU(ctx context.Context, qemu string) (qemuInfo, error) {
	path, err := exec.LookPath(qemu)
	if err != nil {
		return qemuInfo{}, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return qemuInfo{}, err
	}
	key := fmt.Sprintf("%s\x00%d\x00%d", path, fi.Size(), fi.ModTime().UnixNano())
	if v, ok := qemuInfos.Load(key); ok {
		return v.(qemuInfo), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return qemuInfo{}, fmt.Errorf("%s --version: %w", path, err)
	}
	info := qemuInfo{version: parseVersion(out)}
	if out, err = exec.CommandContext(ctx, path, "-machine", "help").Output(); err != nil {
		return qemuInfo{}, fmt.Errorf("%s -machine help: %w", path, err)
	}
	info.machines = parseMachines(out)
	qemuInfos.Store(key, info)
	return info, nil
}

// warmQEMU asks qemu what probeQEMU asks (about 30 ms of two runs), so
// that the first suspend, which records the answer, and the first
// CanRestore find it cached.
func warmQEMU(qemu string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = probeQEMU(ctx, qemu)
}

// parseVersion reads "QEMU emulator version 7.2.22 (Debian …)".
func parseVersion(out []byte) string {
	line, _, _ := bytes.Cut(out, []byte("\n"))
	_, v, ok := strings.Cut(string(line), "version ")
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// parseMachines reads `-machine help`: a header, then a machine a line,
// its name first.
func parseMachines(out []byte) []string {
	var ms []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasSuffix(sc.Text(), ":") {
			continue
		}
		ms = append(ms, f[0])
	}
	return ms
}

// meminfo is the file the node's free memory is read from (a test's
// may be another).
var meminfo = "/proc/meminfo"

// freeMemory is MemAvailable in bytes, -1 if unknown.
func freeMemory() int64 {
	b, err := os.ReadFile(meminfo)
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			f := strings.Fields(rest)
			if n, err := strconv.ParseInt(f[0], 10, 64); err == nil && len(f) == 2 && f[1] == "kB" {
				return n << 10
			}
		}
	}
	return -1
}

// freeDisk is what an unprivileged writer may still write under path (or
// its nearest existing parent), -1 if unknown, and where it was measured.
func freeDisk(path string) (int64, string) {
	for p := path; ; p = filepath.Dir(p) {
		var fs syscall.Statfs_t
		if err := syscall.Statfs(p, &fs); err == nil {
			return int64(fs.Bavail) * fs.Bsize, p
		}
		if p == filepath.Dir(p) {
			return -1, path
		}
	}
}

// cpuVendor is the host CPU's vendor_id ("GenuineIntel"), "" if unknown.
func cpuVendor() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "vendor_id" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// compatOf is what snapshot s of st's VM (spec) needs of a node: recorded
// with the suspension. What cannot be told is left out, and not checked.
func (d *Driver) compatOf(ctx context.Context, st *state, spec compute.Spec, s *suspension) *compat {
	c := &compat{Machine: machineType, Accel: st.Accel, Bytes: s.Size}
	c.Memory, _, _ = shape(spec.Options)
	if info, err := probeQEMU(ctx, d.cfg.QEMU); err == nil {
		c.QEMU = info.version
	}
	if c.Accel == AccelKVM {
		c.CPU = cpuVendor()
	}
	return c
}

// compatMeta is c as object metadata, nil for none.
func compatMeta(c *compat) map[string]string {
	if c == nil {
		return nil
	}
	b, _ := json.Marshal(c)
	return map[string]string{compatKey: string(b)}
}

// CanRestore says whether this node can restore the snapshot behind ref
// for spec's sandbox (compute.Checker): nil, or an error wrapping
// compute.ErrRejected that says what is missing. A reference this node
// cannot read (another node's, consumed, not held, an object not there) is
// nil: the resume says what it is. A snapshot recorded before compat was
// is judged on what the node knows of it (its memory, its accelerator).
func (d *Driver) CanRestore(ctx context.Context, spec compute.Spec, ref string) error {
	id := spec.SandboxID
	c, fetched, err := d.needs(ctx, spec, ref)
	if err != nil || c == nil {
		return err
	}
	h := host{FreeMemory: freeMemory()}
	if c.Accel == AccelKVM {
		h.CPU = cpuVendor()
	}
	h.FreeDisk, h.Disk = freeDisk(d.root)
	if info, err := probeQEMU(ctx, d.cfg.QEMU); err == nil {
		h.QEMU, h.Machines = info.version, info.machines
	}
	h.Accel = c.Accel // a snapshot held here restores under its own (Resume)
	if fetched {
		h.Accel, _ = d.Accelerator(ctx)
	} else if c.Accel == AccelKVM {
		if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
			h.Accel = AccelTCG
		} else {
			f.Close()
		}
	}
	if why := h.fits(*c, fetched); len(why) > 0 {
		return fmt.Errorf("%w: node %s cannot restore the snapshot of %s: %s", compute.ErrRejected, spec.Node, id, strings.Join(why, "; "))
	}
	return nil
}

// needs is what the snapshot behind ref needs, and whether it would be
// fetched from the object store; nil when this node cannot read it.
func (d *Driver) needs(ctx context.Context, spec compute.Spec, ref string) (*compat, bool, error) {
	memory, _, _ := shape(spec.Options)
	_, st, unlock, err := d.open(spec.SandboxID)
	unlock()
	if err != nil {
		return nil, false, nil
	}
	if st != nil && st.Consumed != nil && st.Consumed.Ref == ref {
		// Consumed here already (a resume whose answer was lost): the
		// resume, asked again, answers as it did.
		return nil, false, nil
	}
	if o, err := parseObjectRef(ref); err == nil {
		if d.cfg.Snapshots == nil {
			return nil, false, nil
		}
		info, err := d.cfg.Snapshots.GetInfo(ctx, o.name)
		switch {
		case errors.Is(err, jetstream.ErrObjectNotFound):
			return nil, false, nil
		case err != nil:
			return nil, false, fmt.Errorf("the snapshot object %s: %w (%w)", o.name, compute.ErrUnavailable, err)
		}
		// Without metadata (exported before compat was), the object's
		// compressed size is all that is known of the disk it takes.
		c := &compat{Memory: memory, Bytes: int64(info.Size)}
		if b, ok := info.Metadata[compatKey]; ok {
			if err := json.Unmarshal([]byte(b), c); err != nil {
				return nil, false, nil
			}
		}
		return c, true, nil
	}
	if st == nil {
		return nil, false, nil
	}
	if held, ok := st.held(); !ok || held != ref {
		return nil, false, nil
	}
	if c := st.Suspension.Compat; c != nil {
		cc := *c
		return &cc, false, nil
	}
	return &compat{Memory: memory, Accel: st.Accel}, false, nil
}
