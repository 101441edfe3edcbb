package remote_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/process"
	"github.com/torpor/torpor/services/compute/remote"
)

// torporBin is the torpor binary the process driver's supervisors run.
var torporBin string

func TestMain(m *testing.M) { drivertest.Main(m, &torporBin) }

// TestRemoteContractProcess runs the driver contract suite against the
// process driver behind the bus, its supervisors reporting on the same
// server to drivertest's stand-in of the gateway.
func TestRemoteContractProcess(t *testing.T) {
	bin := torporBin
	drivertest.Run(t, func(t *testing.T) drivertest.Harness {
		g := drivertest.NewGateway(t)
		data := t.TempDir()
		d, err := process.New(process.Config{Data: data, NATSURL: g.URL, Binary: bin, Heartbeat: 100 * time.Millisecond, Grace: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { leftBehind(t, d, data) })
		serve(t, connect(t, g.URL), "n1", compute.Registry{"process": d})
		return drivertest.Harness{
			Driver:  remote.NewClient(connect(t, g.URL), "n1", "process"),
			Reports: g.All,
			Spec: func(id string) compute.Spec {
				return compute.Spec{SandboxID: id, Node: "n1", Command: []string{"sleep", "3600"}}
			},
		}
	})
}

// leftBehind deletes, through d itself, every sandbox left under data, and
// fails the test if a process naming data is left after that.
func leftBehind(t *testing.T, d *process.Driver, data string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(data, "process"))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for _, e := range entries {
		if err := d.Delete(ctx, compute.Spec{SandboxID: e.Name()}); err != nil {
			t.Errorf("delete %s at cleanup: %v", e.Name(), err)
		}
	}
	for _, pid := range drivertest.ProcessesNaming(data) {
		t.Errorf("process %d is left: %s", pid, drivertest.Cmdline(pid))
	}
}
