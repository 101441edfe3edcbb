package vm

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// SetMeminfo makes the node's free memory, as CanRestore reads it, mib MiB
// for the rest of the test (issue 29).
func SetMeminfo(t *testing.T, mib int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(path, []byte("MemAvailable:   "+strconv.Itoa(mib*1024)+" kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := meminfo
	meminfo = path
	t.Cleanup(func() { meminfo = old })
}

// SnapshotNeeds is what the held snapshot of sandbox id says it needs of a
// node: its machine type, QEMU version and memory (MiB).
func SnapshotNeeds(t *testing.T, d *Driver, id string) (machine, qemu string, memory int) {
	t.Helper()
	_, st, unlock, err := d.open(id)
	unlock()
	if err != nil || st == nil || st.Suspension == nil || st.Suspension.Compat == nil {
		t.Fatalf("sandbox %s's snapshot records no needs: %+v, %v", id, st, err)
	}
	c := st.Suspension.Compat
	return c.Machine, c.QEMU, c.Memory
}
