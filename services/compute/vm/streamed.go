package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/services/compute"
)

// fetchStreamed begins the fetch of the snapshot of object o into dir for
// generation req.Generation and returns as soon as its RAM file has its
// size (the stream's header is read): the restoring QEMU can start, and
// map it, while the memory still comes. rest waits for the end of the
// fetch and says whether all of the snapshot came and matches o's digest;
// only then may the device state be fed to QEMU (restoreIncoming). rest may
// be called more than once. An object that is not there is ErrUnknownRef
// (consumed, discarded, or never made).
func (d *Driver) fetchStreamed(ctx context.Context, dir string, req compute.Resume, o objectRef) (s *suspension, rest func() error, err error) {
	if d.cfg.Snapshots == nil {
		return nil, nil, fmt.Errorf("%w: this node has no object store for snapshots", compute.ErrUnimplemented)
	}
	r, err := d.cfg.Snapshots.Get(ctx, o.name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, nil, fmt.Errorf("%w: %s: no such snapshot object", compute.ErrUnknownRef, o)
	}
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		r.Close()
		return nil, nil, err
	}
	s = &suspension{Generation: req.Generation - 1, Ref: o.String(), Held: true, RAM: fmt.Sprintf("ram-%d", req.Generation), Digest: o.digest}
	laid := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		defer r.Close()
		err := readSnapshot(r, dir, s, o.digest, func() { close(laid) })
		if err != nil {
			_ = os.Remove(filepath.Join(dir, s.RAM))
			if s.State != "" {
				_ = os.Remove(filepath.Join(dir, s.State))
			}
			err = fmt.Errorf("snapshot %s: %w: not restored", o, err)
		}
		done <- err
	}()
	var once sync.Once
	var end error
	rest = func() error {
		once.Do(func() { end = <-done })
		return end
	}
	select {
	case <-laid:
		return s, rest, nil
	case err := <-done:
		once.Do(func() { end = err })
		if err == nil {
			return s, rest, nil
		}
		return nil, nil, err
	}
}
