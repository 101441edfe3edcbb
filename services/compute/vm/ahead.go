package vm

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/services/compute"
)

// An export ahead: on a node with peers (Config.ExportAhead) a suspension
// puts its movable snapshot into the object store in the background, once
// the suspend has answered, so that a resume on another node only fetches
// it. One export of a sandbox runs at a time, kept in memory only (a
// driver restarted exports again when asked); it never takes the
// sandbox's lock, and what it made is recorded (suspension.Exported) by
// the next call that holds the lock (settleExport). An object is whole
// only once its Put returned: the object store writes its name's metadata
// after the last chunk, so a reader never sees a partial one, and the
// reference carries the digest of the whole stream.
type exporting struct {
	ref     string // the suspension's reference
	start   time.Time
	done    chan struct{}
	stopped chan struct{} // closed by cancel
	now     chan struct{} // closed: no more delay (begin)
	begin   sync.Once
	cancel  func() // stops the Put; the partial object is purged, a whole one deleted
	// Set before done is closed:
	via   string // the object's reference
	bytes int64  // the object's size
	took  time.Duration
	err   error
}

// errExportStopped is what a stopped export ends with.
var errExportStopped = errors.New("the export was stopped: the snapshot is consumed or discarded here")

// exports are the sandboxes' exports under way or finished and not yet
// recorded, by sandbox id.
type exports struct {
	mu sync.Mutex
	m  map[string]*exporting
}

// objectName is the object that suspension s of sandbox id moves as.
func objectName(id string, s *suspension) string {
	return id + "/" + strings.TrimSuffix(s.State, ".state")
}

// startExport starts the export of the held snapshot s of sandbox id (in
// dir), after delay, unless one of it runs, and returns it. The caller
// holds the sandbox's lock.
func (d *Driver) startExport(id, dir string, s *suspension, delay time.Duration) *exporting {
	d.ahead.mu.Lock()
	defer d.ahead.mu.Unlock()
	if e := d.ahead.m[id]; e != nil && e.ref == s.Ref {
		if delay == 0 {
			e.begin.Do(func() { close(e.now) })
		}
		return e
	}
	if d.ahead.m == nil {
		d.ahead.m = map[string]*exporting{}
	}
	pr, pw := io.Pipe()
	e := &exporting{ref: s.Ref, start: time.Now(), done: make(chan struct{}), stopped: make(chan struct{}), now: make(chan struct{})}
	var once sync.Once
	e.cancel = func() {
		once.Do(func() {
			close(e.stopped)
			pw.CloseWithError(errExportStopped)
		})
	}
	d.ahead.m[id] = e
	snap := *s // the goroutine reads the files only: the lock's holder may change s
	go func() {
		defer close(e.done)
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-e.now:
				t.Stop()
			case <-e.stopped:
				t.Stop()
				e.err = errExportStopped
				return
			}
		}
		// The Put's own bound: the store answers each chunk, a stopped one
		// is purged on a context that still lives.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		e.via, e.bytes, e.err = d.put(ctx, id, dir, &snap, pr, pw)
		e.took = time.Since(e.start)
		select {
		case <-e.stopped:
			// Stopped as it finished: nobody records it, it goes.
			if o, err := parseObjectRef(e.via); e.err == nil && err == nil {
				_ = d.cfg.Snapshots.Delete(ctx, o.name)
			}
			e.err = errExportStopped
		default:
		}
	}()
	return e
}

// put writes the movable stream of s into the object store through the
// pipe pr/pw and returns the object's reference and size.
func (d *Driver) put(ctx context.Context, id, dir string, s *suspension, pr *io.PipeReader, pw *io.PipeWriter) (string, int64, error) {
	name := objectName(id, s)
	h := sha256.New()
	go func() { pw.CloseWithError(writeSnapshot(pw, h, dir, s, d.cfg.beforeExport)) }()
	meta := jetstream.ObjectMeta{Name: name, Description: "torpor vm snapshot of " + id, Opts: &jetstream.ObjectMetaOptions{ChunkSize: objectChunk}}
	meta.Metadata = compatMeta(s.Compat) // what a node restoring it needs (check.go)
	info, err := d.cfg.Snapshots.Put(ctx, meta, pr)
	if err != nil {
		pr.CloseWithError(err)
		return "", 0, err
	}
	return objectRef{name: name, digest: hex.EncodeToString(h.Sum(nil))}.String(), int64(info.Size), nil
}

// settleExport records, under the sandbox's lock, what a finished export
// of sandbox id made: the object's reference on the suspension it was made
// of, if that is still held; else the object is deleted (consumed or
// discarded meanwhile). An export still under way is left to run.
func (d *Driver) settleExport(ctx context.Context, id, dir string, st *state) error {
	d.ahead.mu.Lock()
	e := d.ahead.m[id]
	if e != nil {
		select {
		case <-e.done:
			delete(d.ahead.m, id)
		default:
			e = nil
		}
	}
	d.ahead.mu.Unlock()
	if e == nil || e.err != nil {
		return nil
	}
	if st != nil && st.Suspension != nil && st.Suspension.Ref == e.ref && st.Suspension.Held {
		if st.Suspension.Exported == e.via {
			return nil
		}
		st.Suspension.Exported = e.via
		return save(dir, st)
	}
	if o, err := parseObjectRef(e.via); err == nil {
		_ = d.cfg.Snapshots.Delete(ctx, o.name)
	}
	return nil
}

// awaitExport waits, under the sandbox's lock, for the export of sandbox
// id under way, if any, and settles it.
func (d *Driver) awaitExport(ctx context.Context, id, dir string, st *state) error {
	d.ahead.mu.Lock()
	e := d.ahead.m[id]
	d.ahead.mu.Unlock()
	if e != nil {
		select {
		case <-e.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return d.settleExport(ctx, id, dir, st)
}

// stopExport stops the export of sandbox id under way, if any, without
// waiting for it (its partial object is purged, one it finishes as it is
// stopped deleted), and records one that finished: called under the
// sandbox's lock before its snapshot is consumed here.
func (d *Driver) stopExport(ctx context.Context, id, dir string, st *state) error {
	d.ahead.mu.Lock()
	e := d.ahead.m[id]
	if e != nil {
		select {
		case <-e.done:
			e = nil // finished: settled below
		default:
			e.cancel()
			delete(d.ahead.m, id)
		}
	}
	d.ahead.mu.Unlock()
	return d.settleExport(ctx, id, dir, st)
}

// DefaultExportDelay is how long an export ahead waits after the suspend
// answered (Config.ExportDelay): the suspension is recorded meanwhile, and
// a resume on the same node that follows at once stops an export that has
// not begun, not one that loads the bus and the cores.
const DefaultExportDelay = 250 * time.Millisecond

// exportAhead starts the export of the suspension just recorded (Suspend,
// under the sandbox's lock), on a node with peers.
func (d *Driver) exportAhead(id, dir string, s *suspension) {
	if d.cfg.ExportAhead && d.cfg.Snapshots != nil {
		d.startExport(id, dir, s, cmp.Or(d.cfg.ExportDelay, DefaultExportDelay))
	}
}

// Movable says whether the snapshot behind ref of spec's sandbox is whole
// in the object store, with the object's reference and size, and how long
// its export took when it ran ahead here ("" and 0 while it is not). It
// waits for nothing.
func (d *Driver) Movable(ctx context.Context, spec compute.Spec, ref string) (via string, bytes int64, took time.Duration, err error) {
	id := spec.SandboxID
	if d.cfg.Snapshots == nil {
		return "", 0, 0, nil
	}
	d.ahead.mu.Lock()
	if e := d.ahead.m[id]; e != nil && e.ref == ref {
		select {
		case <-e.done:
			via, bytes, took, err = e.via, e.bytes, e.took, e.err
		default:
		}
		d.ahead.mu.Unlock()
		return via, bytes, took, err
	}
	d.ahead.mu.Unlock()
	_, st, unlock, err := d.open(id)
	defer unlock()
	if err != nil || st == nil || st.Suspension == nil || st.Suspension.Ref != ref || st.Suspension.Exported == "" {
		return "", 0, 0, err
	}
	o, err := parseObjectRef(st.Suspension.Exported)
	if err != nil {
		return "", 0, 0, nil
	}
	info, err := d.cfg.Snapshots.GetInfo(ctx, o.name)
	if err != nil {
		return "", 0, 0, fmt.Errorf("movable %s: %w", id, err)
	}
	return st.Suspension.Exported, int64(info.Size), 0, nil
}

// dropExport stops the export of sandbox id under way, if any, without
// waiting for it, and deletes what a finished one made: under the
// sandbox's lock, before its snapshot is removed here.
func (d *Driver) dropExport(ctx context.Context, id string) {
	d.ahead.mu.Lock()
	e := d.ahead.m[id]
	delete(d.ahead.m, id)
	d.ahead.mu.Unlock()
	if e == nil {
		return
	}
	e.cancel()
	select {
	case <-e.done:
		if o, err := parseObjectRef(e.via); e.err == nil && err == nil {
			_ = d.cfg.Snapshots.Delete(ctx, o.name)
		}
	default:
	}
}

// AwaitExport waits for the export ahead of ref of spec's sandbox, if one
// runs or ran here, and says what it made (compute.ExportAwaiter, issue
// 29): "" and 0 on a node with no peers, for a ref exported by no export
// ahead here, or one stopped (the snapshot consumed or discarded
// meanwhile).
func (d *Driver) AwaitExport(ctx context.Context, spec compute.Spec, ref string) (string, int64, error) {
	if !d.cfg.ExportAhead || d.cfg.Snapshots == nil {
		return "", 0, nil
	}
	d.ahead.mu.Lock()
	e := d.ahead.m[spec.SandboxID]
	d.ahead.mu.Unlock()
	if e != nil && e.ref == ref {
		select {
		case <-e.done:
		case <-ctx.Done():
			return "", 0, ctx.Err()
		}
	}
	via, bytes, _, err := d.Movable(ctx, spec, ref)
	if errors.Is(err, errExportStopped) {
		return "", 0, nil
	}
	return via, bytes, err
}
