package kvview

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// Checkpoint is the highest seq the writer applied: where a restarted
// projection stands (projections.Checkpointer). It costs one read: every
// batch stores it in the key _torpor.checkpoint of the bucket after the
// views it covers (a key no sandbox can have: sandbox ids have no dots, and
// every reader leaves it out). Only a bucket written before that key existed
// is scanned, once, for the highest seq of its views.
func (v *View) Checkpoint(ctx context.Context) (uint64, error) {
	cp, err := v.readCheckpoint(ctx)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: %w", err)
	}
	if cp.rev != 0 {
		return cp.seq, nil
	}
	var last uint64
	err = v.scan(ctx, func(view events.View) { last = max(last, view.Seq) })
	if err != nil {
		return 0, fmt.Errorf("checkpoint: %w", err)
	}
	return last, nil
}

// checkpointKey holds the highest seq the writer applied. It can never be a
// sandbox id (events.CheckAppend refuses dots), and every reader leaves it
// out.
const checkpointKey = "_torpor.checkpoint"

// checkpoint is the writer's copy of the checkpoint key.
type checkpoint struct {
	loaded bool
	seq    uint64
	rev    uint64 // 0: the key does not exist
}

// saveCheckpoint raises the checkpoint key to seq, after the views it covers
// are stored; a checkpoint at or above seq stays. wmu is held.
func (v *View) saveCheckpoint(ctx context.Context, seq uint64) error {
	for try := 0; ; try++ {
		if !v.cp.loaded {
			cp, err := v.readCheckpoint(ctx)
			if err != nil {
				return err
			}
			v.cp = cp
		}
		// A bucket with views but no key is scanned for a checkpoint: write
		// the key even at 0, when views were written while the first event
		// was held.
		if seq <= v.cp.seq && v.cp.rev != 0 {
			return nil
		}
		rev, err := v.kv.Update(ctx, checkpointKey, strconv.AppendUint(nil, seq, 10), v.cp.rev)
		if err == nil {
			v.cp = checkpoint{loaded: true, seq: seq, rev: rev}
			return nil
		}
		v.cp = checkpoint{}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) || try >= conflictRetries {
			return fmt.Errorf("put checkpoint %d: %w", seq, err)
		}
	}
}

// readCheckpoint reads the checkpoint key; found is false when the bucket
// has none.
func (v *View) readCheckpoint(ctx context.Context) (checkpoint, error) {
	e, err := v.kv.Get(ctx, checkpointKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return checkpoint{loaded: true}, nil
	case err != nil:
		return checkpoint{}, fmt.Errorf("get checkpoint: %w", err)
	}
	seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return checkpoint{}, fmt.Errorf("checkpoint rev %d: %w", e.Revision(), err)
	}
	return checkpoint{loaded: true, seq: seq, rev: e.Revision()}, nil
}
