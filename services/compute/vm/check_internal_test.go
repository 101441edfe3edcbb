package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/supervisor"
)

// TestFits: what a node offers against what a snapshot needs, each
// shortfall said once; the rest restores.
func TestFits(t *testing.T) {
	snap := compat{QEMU: "7.2.22", Machine: "microvm", Accel: AccelTCG, Memory: 128, Bytes: 64 << 20}
	node := host{QEMU: "7.2.22", Machines: []string{"microvm", "pc-q35-7.2", "pc-i440fx-7.2"}, Accel: AccelTCG, CPU: "GenuineIntel",
		FreeMemory: 8 << 30, FreeDisk: 50 << 30, Disk: "/var/lib/torpor"}
	with := func(f func(*compat, *host)) (compat, host) {
		c, h := snap, node
		h.Machines = slices.Clone(node.Machines)
		f(&c, &h)
		return c, h
	}
	cases := []struct {
		name    string
		f       func(*compat, *host)
		fetched bool
		want    []string // a word of each reason, in order
	}{
		{"the same node's snapshot", func(*compat, *host) {}, false, nil},
		{"fetched, room enough", func(*compat, *host) {}, true, nil},
		{"a machine type QEMU here lacks", func(c *compat, _ *host) { c.Machine = "pc-q35-9.2"; c.QEMU = "7.2.1" }, false, []string{"machine type pc-q35-9.2 is not in QEMU 7.2.22"}},
		{"a versioned machine from an older QEMU", func(c *compat, h *host) {
			c.Machine, h.QEMU, h.Machines = "pc-q35-7.2", "8.2.1", append(h.Machines, "pc-q35-8.2")
		}, false, nil},
		{"a newer QEMU's state", func(c *compat, _ *host) { c.QEMU = "8.2.0" }, false, []string{"older than the snapshot's 8.2.0"}},
		{"microvm of another release", func(_ *compat, h *host) { h.QEMU = "8.2.1" }, false, []string{"has no version"}},
		{"microvm of another micro release", func(_ *compat, h *host) { h.QEMU = "7.2.23" }, false, nil},
		{"made under KVM, restored under TCG", func(c *compat, _ *host) { c.Accel = AccelKVM }, false, []string{"made under kvm; this node restores under tcg"}},
		{"under KVM on another vendor's CPU", func(c *compat, h *host) { c.Accel, h.Accel, c.CPU = AccelKVM, AccelKVM, "AuthenticAMD" }, false, []string{"AuthenticAMD CPU"}},
		{"more memory than the node has free", func(c *compat, h *host) { c.Memory, h.FreeMemory = 4096, 1<<30 }, false, []string{"4096 MiB is more than the node's free memory (1024 MiB"}},
		{"fetched, too little disk", func(_ *compat, h *host) { h.FreeDisk = 10 << 20 }, true, []string{"takes 64 MiB laid out; 10 MiB free under /var/lib/torpor"}},
		{"held here, too little disk: nothing to lay out", func(_ *compat, h *host) { h.FreeDisk = 10 << 20 }, false, nil},
		{"unknowns are not refused", func(c *compat, h *host) {
			*h = host{FreeMemory: -1, FreeDisk: -1}
			c.Memory = 16384
		}, true, nil},
		{"two shortfalls", func(c *compat, h *host) { c.Machine, h.FreeMemory = "pc-q35-9.2", 1<<20 }, false, []string{"pc-q35-9.2", "free memory"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, h := with(tc.f)
			got := h.fits(c, tc.fetched)
			if len(got) != len(tc.want) {
				t.Fatalf("fits = %q, want %d reasons like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("reason %d = %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}

// TestParseQEMU reads this node's QEMU as probeQEMU does, and its own
// words for a known output.
func TestParseQEMU(t *testing.T) {
	out := "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright (c) 2003-2022 Fabrice Bellard\n"
	if got := parseVersion([]byte(out)); got != "7.2.22" {
		t.Errorf("version %q, want 7.2.22", got)
	}
	help := "Supported machines are:\nmicrovm              microvm (i386)\npc                   Standard PC (alias of pc-i440fx-7.2)\npc-q35-7.2           Standard PC (Q35 + ICH9, 2009)\nnone                 empty machine\n"
	if got, want := parseMachines([]byte(help)), []string{"microvm", "pc", "pc-q35-7.2", "none"}; !slices.Equal(got, want) {
		t.Errorf("machines %q, want %q", got, want)
	}
	if !strings.HasPrefix(strings.Join(machine{}.args(false), " "), "-M "+machineType+",") {
		t.Errorf("QEMU's command line %q runs no %s: compat records the wrong machine type", machine{}.args(false), machineType)
	}
}

// fakeMeminfo makes the node's free memory mib MiB for the test.
func fakeMeminfo(t *testing.T, mib int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(path, []byte("MemTotal:       1048576 kB\nMemAvailable:   "+strconv.Itoa(mib*1024)+" kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := meminfo
	meminfo = path
	t.Cleanup(func() { meminfo = old })
}

// checkDriver is a vm driver on a fresh data directory (it boots nothing)
// with snapshots in store.
func checkDriver(t *testing.T, store jetstream.ObjectStore) *Driver {
	t.Helper()
	if _, err := probeQEMU(context.Background(), "qemu-system-x86_64"); err != nil {
		t.Skipf("SKIPPED, NOT PASSED: no QEMU to ask: %v", err)
	}
	d, err := New(Config{Data: t.TempDir(), NATSURL: "nats://127.0.0.1:1", Binary: "/bin/true", Accel: AccelTCG, Snapshots: store})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// suspendedHere lays out a suspended sandbox as Suspend leaves it (a
// device state file and a sparse RAM file with a few written blocks),
// its suspension's compat recorded by compatOf and then changed by edit,
// and returns its spec and reference.
func suspendedHere(t *testing.T, d *Driver, node string, edit func(*compat)) (compute.Spec, string) {
	t.Helper()
	spec := compute.Spec{SandboxID: "sb-" + strings.ReplaceAll(t.Name(), "/", "-"), Node: node, Options: map[string]string{"memory": "256"}}
	dir := filepath.Join(d.root, spec.SandboxID)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "snap-1-ab.state"), []byte("device state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := freshRAM(filepath.Join(dir, "ram-1"), 256); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "ram-1"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(strings.Repeat("guest memory", 1000)), 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	digest, size, err := syncDigest(filepath.Join(dir, "snap-1-ab.state"))
	if err != nil {
		t.Fatal(err)
	}
	ram, _ := allocated(filepath.Join(dir, "ram-1"))
	st := &state{Generation: 1, RAM: "ram-1", Accel: AccelTCG}
	s := &suspension{Generation: 1, Ref: "vm:" + node + ":" + spec.SandboxID + ":snap-1-ab:" + digest, Held: true, State: "snap-1-ab.state", RAM: "ram-1", Digest: digest, Size: size + ram}
	s.Compat = d.compatOf(context.Background(), st, spec, s)
	if edit != nil {
		edit(s.Compat)
	}
	st.Suspension = s
	if err := supervisor.WriteJSON(filepath.Join(dir, stateFile), st); err != nil {
		t.Fatal(err)
	}
	return spec, s.Ref
}

// refused fails unless err is a refusal (ErrRejected, FAILED_PRECONDITION)
// saying want.
func refused(t *testing.T, err error, want string) {
	t.Helper()
	if !errors.Is(err, compute.ErrRejected) || events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), want) {
		t.Fatalf("CanRestore = %v (%s), want a refusal (FAILED_PRECONDITION) saying %q", err, events.CodeOf(err), want)
	}
}

// TestCanRestoreHere (issue 29): a snapshot held on this node, its needs
// recorded as Suspend records them, is checked against this node's real
// QEMU (asked, not booted) and its free memory: one recorded with a
// machine type QEMU here lacks, or bigger than the free memory, is
// refused saying so; the one as recorded restores; a reference not held
// here is not judged.
func TestCanRestoreHere(t *testing.T) {
	d := checkDriver(t, nil)
	ctx := context.Background()

	spec, ref := suspendedHere(t, d, "n1", nil)
	if err := d.CanRestore(ctx, spec, ref); err != nil {
		t.Fatalf("the snapshot as recorded: %v", err)
	}
	_, st, unlock, err := d.open(spec.SandboxID)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	info, _ := probeQEMU(ctx, "qemu-system-x86_64")
	if c := st.Suspension.Compat; c == nil || c.Machine != "microvm" || c.QEMU != info.version || c.Memory != 256 || c.Accel != AccelTCG || c.Bytes != st.Suspension.Size {
		t.Fatalf("recorded compat %+v; want microvm, QEMU %s, 256 MiB, tcg, %d bytes", c, info.version, st.Suspension.Size)
	}

	spec, ref = suspendedHere(t, d, "n1", func(c *compat) { c.Machine = "pc-q35-99.0" })
	refused(t, d.CanRestore(ctx, spec, ref), "machine type pc-q35-99.0 is not in QEMU "+info.version)

	spec, ref = suspendedHere(t, d, "n1", nil)
	fakeMeminfo(t, 200)
	refused(t, d.CanRestore(ctx, spec, ref), "256 MiB is more than the node's free memory (200 MiB")
	if err := d.CanRestore(ctx, spec, ref+"0"); err != nil {
		t.Errorf("a reference not held here: %v, want nil (the resume says)", err)
	}
	if err := d.CanRestore(ctx, compute.Spec{SandboxID: "never", Node: "n1"}, ref); err != nil {
		t.Errorf("a sandbox not here: %v, want nil", err)
	}
}

// TestCanRestoreFetched: an exported snapshot carries its needs with its
// object; the node that would fetch it is checked against them (its free
// memory), and without the object it does not judge.
func TestCanRestoreFetched(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := srv.JS.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: SnapshotBucket})
	if err != nil {
		t.Fatal(err)
	}
	n1, n2 := checkDriver(t, store), checkDriver(t, store)
	spec, ref := suspendedHere(t, n1, "n1", nil)
	moved, err := n1.Export(ctx, spec, ref)
	if err != nil {
		t.Fatal(err)
	}
	at2 := spec
	at2.Node = "n2"
	if err := n2.CanRestore(ctx, at2, moved); err != nil {
		t.Fatalf("n2 with room: %v", err)
	}
	fakeMeminfo(t, 100)
	refused(t, n2.CanRestore(ctx, at2, moved), "node n2 cannot restore the snapshot of "+spec.SandboxID+": the guest's 256 MiB")

	// Consumed on n2 already (a resume whose answer was lost): not judged,
	// however short of memory n2 is now (its guest runs).
	dir := filepath.Join(n2.root, spec.SandboxID)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := supervisor.WriteJSON(filepath.Join(dir, stateFile), &state{Generation: 2, Consumed: &consumption{Ref: moved, Generation: 2}}); err != nil {
		t.Fatal(err)
	}
	if err := n2.CanRestore(ctx, at2, moved); err != nil {
		t.Errorf("a reference consumed here: %v, want nil (the resume answers as it did)", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}

	// What only the object's metadata says: the machine type.
	spec3, ref3 := suspendedHere(t, n1, "n1", func(c *compat) { c.Machine = "pc-q35-99.0"; c.Memory = 64 })
	moved3, err := n1.Export(ctx, spec3, ref3)
	if err != nil {
		t.Fatal(err)
	}
	fakeMeminfo(t, 1<<20)
	spec3.Node = "n2"
	refused(t, n2.CanRestore(ctx, spec3, moved3), "machine type pc-q35-99.0")
	o, _ := parseObjectRef(moved)
	if err := store.Delete(ctx, o.name); err != nil {
		t.Fatal(err)
	}
	if err := n2.CanRestore(ctx, at2, moved); err != nil {
		t.Errorf("an object not there: %v, want nil (the resume says)", err)
	}
}
