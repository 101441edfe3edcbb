package vm_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/vm"
)

// gate holds the exports of a driver while it is shut, each once it has
// the snapshot's files open (it says so on arrived).
type gate struct {
	mu      sync.Mutex
	open    chan struct{}
	arrived chan struct{}
}

func newGate() *gate { return &gate{open: make(chan struct{}), arrived: make(chan struct{}, 16)} }

func (g *gate) wait() {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	select {
	case g.arrived <- struct{}{}:
	default:
	}
	<-ch
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// drain empties c.
func drain(c chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// aheadDriver is a driver of a node with peers: its suspensions are
// exported ahead, held at g while it is shut.
func aheadDriver(t *testing.T, g *drivertest.Gateway, at *gate) (*vm.Driver, vm.Config) {
	t.Helper()
	t.Cleanup(at.release)
	return newDriver(t, g, func(c *vm.Config) {
		c.ExportAhead = true
		vm.SetBeforeExport(c, at.wait)
	})
}

// objectsOf lists the snapshot objects of sandbox id.
func objectsOf(t testing.TB, cfg vm.Config, id string) []string {
	t.Helper()
	infos, err := cfg.Snapshots.List(ctx(t))
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, info := range infos {
		if strings.HasPrefix(info.Name, id+"/") {
			names = append(names, info.Name)
		}
	}
	return names
}

// movable waits until d says the snapshot behind ref is whole in the
// object store, and returns its reference.
func movable(t testing.TB, d *vm.Driver, s compute.Spec, ref string) string {
	t.Helper()
	var via string
	eventually(t, "the snapshot is movable", func() bool {
		v, n, _, err := d.Movable(ctx(t), s, ref)
		if err != nil {
			t.Fatal(err)
		}
		if v != "" && n <= 0 {
			t.Fatalf("movable as %s of %d bytes", v, n)
		}
		via = v
		return v != ""
	})
	return via
}

// TestExportAhead: on nodes with peers, a suspension's snapshot goes to
// the object store in the background. One guest, booted once, goes
// through it: a resume on another node that comes while the export is
// still under way waits for it and restores the guest where it was; a
// resume on the same node after it drops the object; a delete while an
// export runs leaves no object. A second guest: a discard (retention) of
// a snapshot exported ahead leaves no object.
func TestExportAhead(t *testing.T) {
	g := drivertest.NewGateway(t)
	g1, g2 := newGate(), newGate()
	n1, cfg1 := aheadDriver(t, g, g1)
	n2, cfg2 := aheadDriver(t, g, g2)
	s := spec("n1", counter...)
	s2 := s
	s2.Node = "n2"
	start(t, n1, g, s, 1)
	eventually(t, "the guest counts to 5", func() bool { return lastCount(t, n1, s) >= 5 })

	ok := t.Run("resume elsewhere while the export runs", func(t *testing.T) {
		ref, err := n1.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		at := lastCount(t, n1, s)
		if via, _, _, err := n1.Movable(ctx(t), s, ref); via != "" || err != nil {
			t.Fatalf("movable while the export is held: %q, %v", via, err)
		}
		if got := vm.ExportsUnderWay(n1); got != 1 {
			t.Fatalf("exports under way after the suspend: %d, want 1", got)
		}
		// Issue 29: the wait for the export ahead waits while it is held.
		actx, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
		via, n, err := n1.AwaitExport(actx, s, ref)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || via != "" || n != 0 {
			t.Fatalf("the export ahead awaited while it is held: %q, %d, %v; want the wait's deadline", via, n, err)
		}
		// The resume on n2 asks n1 for the movable snapshot while its
		// export ahead is held; it lets go only once the resume waits.
		type answer struct {
			via string
			err error
		}
		exported := make(chan answer, 1)
		go func() {
			via, err := n1.Export(ctx(t), s, ref)
			exported <- answer{via, err}
		}()
		g1.release()
		a := <-exported
		if a.err != nil {
			t.Fatal(a.err)
		}
		info := objectOf(t, cfg1, a.via)
		if info.Name != objectName(a.via) {
			t.Fatalf("the object of %s is %q", a.via, info.Name)
		}
		if names := objectsOf(t, cfg1, s.SandboxID); len(names) != 1 {
			t.Fatalf("objects of the sandbox: %q, want one (the export ahead, not a second one)", names)
		}
		res, err := n2.Resume(ctx(t), compute.Resume{Spec: s2, Generation: 2, Credential: drivertest.Cred(2), RestoreRef: a.via})
		if err != nil || !res.Consumed {
			t.Fatalf("resume on n2: %+v, %v", res, err)
		}
		g.Await(t, s.SandboxID, compute.ReportAttached, 2)
		eventually(t, "the guest counts on on n2", func() bool { return lastCount(t, n2, s2) > at })
		b, err := n2.Logs(ctx(t), s2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("count 1\n")) {
			t.Fatalf("the guest counted from 1 on n2, not on from %d:\n%q", at, b)
		}
		if err := n1.Discard(ctx(t), s, ref); err != nil {
			t.Fatal(err)
		}
		if names := objectsOf(t, cfg1, s.SandboxID); len(names) != 0 {
			t.Fatalf("objects left once the guest runs on n2: %q", names)
		}
	})
	if !ok {
		return
	}
	ok = t.Run("resume here after the export", func(t *testing.T) {
		g2.release()
		ref, err := n2.Suspend(ctx(t), compute.Target{Spec: s2, Generation: 2})
		if err != nil {
			t.Fatal(err)
		}
		// Issue 29: the wait for the export ahead returns once it
		// finished, with the object's reference and size.
		awaited, n, err := n2.AwaitExport(ctx(t), s2, ref)
		if err != nil || awaited == "" {
			t.Fatalf("the export ahead awaited: %q, %d, %v", awaited, n, err)
		}
		via := movable(t, n2, s2, ref)
		if info := objectOf(t, cfg2, via); awaited != via || n != int64(info.Size) {
			t.Fatalf("the export ahead awaited as %q of %d bytes; the object is %q of %d", awaited, n, via, info.Size)
		}
		if other, n, err := n2.AwaitExport(ctx(t), s2, ref+"x"); other != "" || n != 0 || err != nil {
			t.Fatalf("the export ahead of a reference not held awaited: %q, %d, %v; want none", other, n, err)
		}
		res, err := n2.Resume(ctx(t), compute.Resume{Spec: s2, Generation: 3, Credential: drivertest.Cred(3), RestoreRef: ref})
		if err != nil || !res.Consumed {
			t.Fatalf("resume on n2: %+v, %v", res, err)
		}
		g.Await(t, s.SandboxID, compute.ReportAttached, 3)
		if names := objectsOf(t, cfg2, s.SandboxID); len(names) != 0 {
			t.Fatalf("objects left once the guest runs again where it was: %q", names)
		}
	})
	if !ok {
		return
	}
	ok = t.Run("delete while the export runs", func(t *testing.T) {
		g2.shut()
		if _, err := n2.Suspend(ctx(t), compute.Target{Spec: s2, Generation: 3}); err != nil {
			t.Fatal(err)
		}
		if got := vm.ExportsUnderWay(n2); got != 1 {
			t.Fatalf("exports under way after the suspend: %d, want 1", got)
		}
		drain(g2.arrived)
		<-g2.arrived // the export reads the snapshot's files, open
		if err := n2.Delete(ctx(t), s2); err != nil {
			t.Fatal(err)
		}
		g2.release()
		eventually(t, "no export runs", func() bool { return vm.ExportsUnderWay(n2) == 0 })
		if names := objectsOf(t, cfg2, s.SandboxID); len(names) != 0 {
			t.Fatalf("objects left after the delete: %q", names)
		}
	})
	if !ok {
		return
	}
	t.Run("discard after the export", func(t *testing.T) {
		g1.release()
		s := spec("n1", counter...)
		start(t, n1, g, s, 1)
		ref, err := n1.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		movable(t, n1, s, ref)
		if err := n1.Discard(ctx(t), s, ref); err != nil {
			t.Fatal(err)
		}
		if names := objectsOf(t, cfg1, s.SandboxID); len(names) != 0 {
			t.Fatalf("objects left after the discard: %q", names)
		}
	})
}
