package kvview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// Replayer reads the whole log in order from sequence from, handing the
// events to h in chunks (h keeps the envelopes, not the slice), and returns
// the last sequence it covered; jsstore.Store satisfies it.
type Replayer interface {
	Replay(ctx context.Context, from uint64, h func([]events.Envelope) error) (uint64, error)
}

// RebuildStats says what a Rebuild did.
type RebuildStats struct {
	// Events is how many events were read from the log.
	Events int
	// Views is how many views were written.
	Views int
	// LastSeq is the last sequence of the log the views hold, the
	// checkpoint written with them.
	LastSeq uint64
	// Fold is the time spent reading the log and folding it; Write the
	// time spent writing the views.
	Fold, Write time.Duration
}

// rebuildChunks is how many chunks of the log may wait between the reader
// and the folder.
const rebuildChunks = 8

// Rebuild folds the whole log from src into views in memory and writes them
// all to the bucket cfg.Bucket, which it creates, then their checkpoint
// (under a key of cfg.Bucket's own in the positions bucket); a
// bucket that already holds keys is refused (delete a failed rebuild's
// bucket before trying again). The writes are pipelined async puts, each
// conditional on its key not existing.
//
// Rebuild builds a new bucket beside the live one (say
// torpor_phases_rebuild) while the live projection goes on; it does not swap
// the new bucket in under the name of the contract, torpor_phases: that is
// for the caller, once a projection over the new bucket has caught up from
// its checkpoint.
//
// Reading and folding overlap: src decodes the envelopes of one chunk while
// the previous one is folded (which decodes each event's data again).
func Rebuild(ctx context.Context, js jetstream.JetStream, src Replayer, cfg Config) (RebuildStats, error) {
	var stats RebuildStats
	if cfg.Bucket == "" {
		return stats, errors.New("rebuild: no bucket named")
	}
	v, err := New(ctx, js, cfg)
	if err != nil {
		return stats, fmt.Errorf("rebuild: %w", err)
	}
	status, err := v.kv.Status(ctx)
	if err != nil {
		return stats, fmt.Errorf("rebuild: bucket %s: %w", cfg.Bucket, err)
	}
	if n := status.Values(); n > 0 {
		return stats, fmt.Errorf("rebuild: bucket %s holds %d values; want an empty one", cfg.Bucket, n)
	}

	start := time.Now()
	views, n, last, err := fold(ctx, src)
	if err != nil {
		return stats, fmt.Errorf("rebuild %s: %w", cfg.Bucket, err)
	}
	stats.Events, stats.LastSeq, stats.Fold = n, last, time.Since(start)

	start = time.Now()
	if stats.Views, err = v.writeAll(ctx, views); err != nil {
		return stats, fmt.Errorf("rebuild %s: %w", cfg.Bucket, err)
	}
	if err := v.saveCheckpoint(ctx, last); err != nil {
		return stats, fmt.Errorf("rebuild %s: %w", cfg.Bucket, err)
	}
	stats.Write = time.Since(start)
	return stats, nil
}

// fold reads the whole log of src into one view per sandbox, folding in a
// goroutine of its own while src reads the next chunk.
func fold(ctx context.Context, src Replayer) (views map[string]*events.View, n int, last uint64, err error) {
	chunks := make(chan []events.Envelope, rebuildChunks)
	free := make(chan []events.Envelope, rebuildChunks+2)
	views = make(map[string]*events.View)
	folded := make(chan struct{})
	go func() {
		defer close(folded)
		for chunk := range chunks {
			for i := range chunk {
				env := &chunk[i]
				view := views[env.SandboxID]
				if view == nil {
					view = &events.View{}
					views[env.SandboxID] = view
				}
				view.Fold(*env)
				*env = events.Envelope{} // let the message body go
			}
			n += len(chunk)
			select {
			case free <- chunk[:0]:
			default:
			}
		}
	}()
	last, err = src.Replay(ctx, 1, func(envs []events.Envelope) error {
		var buf []events.Envelope
		select {
		case buf = <-free:
		default:
		}
		select {
		case chunks <- append(buf, envs...):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	close(chunks)
	<-folded
	if err != nil {
		return nil, 0, 0, err
	}
	return views, n, last, nil
}

// writeAll puts every view, each conditional on its key not existing,
// without caching them, and returns how many it wrote.
func (v *View) writeAll(ctx context.Context, views map[string]*events.View) (int, error) {
	const chunk = 10 * writeWindow
	writes := make([]write, 0, min(chunk, len(views)))
	flush := func() error {
		moved, err := v.put(ctx, writes, false)
		if err != nil {
			return err
		}
		if len(moved) > 0 {
			return fmt.Errorf("%d keys written by someone else during the rebuild: %w", len(moved), jetstream.ErrKeyExists)
		}
		writes = writes[:0]
		return nil
	}
	written := 0
	for id, view := range views {
		if !viewKey(id) {
			continue // no view can hold it; the live projection refuses it too
		}
		if view.Seq == 0 {
			continue // the table refused every event of it: no sandbox
		}
		data, err := json.Marshal(view)
		if err != nil {
			return written, fmt.Errorf("encode view %s: %w", id, err)
		}
		writes = append(writes, write{id: id, data: data})
		if len(writes) == chunk {
			if err := flush(); err != nil {
				return written, err
			}
			written += chunk
		}
	}
	n := len(writes)
	if err := flush(); err != nil {
		return written, err
	}
	return written + n, nil
}
