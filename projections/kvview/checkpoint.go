package kvview

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// The checkpoint of a view is the highest seq its writer applied. It lives in
// the followers' positions bucket (events.PositionBucket, beside the sagas'
// positions) under checkpointKey(bucket), so that the view's bucket holds
// views only (CONTRACT §4: its keys are sandbox ids).
//
// The view binds the positions bucket itself rather than taking a position
// from its caller: the checkpoint must only ever rise, also with two writers
// of one view, so every write is conditional on the key's revision, which a
// Get/Set position (jsstore's) cannot say; Rebuild writes the checkpoint of
// a bucket it creates, for which no caller holds a position; and New and
// Rebuild need nothing but the JetStream context they take already. The
// bucket's name comes from events, as projections may not import jsstore.

// checkpointKey is the key of bucket's checkpoint in the positions bucket.
// A rebuild into another bucket gets a key of its own.
func checkpointKey(bucket string) string { return "kvview." + bucket }

// legacyKey is where builds before the positions bucket kept the checkpoint:
// in the view's own bucket. New moves it out (migrate). The dot keeps it
// from being a sandbox id, and readers skip every key with a dot (viewKey),
// so it never shows up as a view, even while an older build still writes it.
const legacyKey = "_torpor.checkpoint"

// positions binds the positions bucket, creating it (with the view's
// replicas) only when it does not exist: a bucket jsstore made stays as it
// was configured.
func positions(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, events.PositionBucket)
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return kv, err
	}
	kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      events.PositionBucket,
		Description: "torpor follower name → last sequence handled",
		History:     1,
		MaxBytes:    events.PositionBucketMaxBytes,
		Replicas:    replicas,
		Storage:     jetstream.FileStorage,
	})
	if errors.Is(err, jetstream.ErrBucketExists) { // made meanwhile, by jsstore or another view
		return js.KeyValue(ctx, events.PositionBucket)
	}
	return kv, err
}

// Checkpoint is the highest seq the writer applied: where a restarted
// projection stands (projections.Checkpointer). It costs one read of the
// positions bucket, where every batch stores it after the views it covers.
// Only a bucket written before any checkpoint existed is scanned, once, for
// the highest seq of its views.
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

// checkpoint is the writer's copy of the checkpoint key.
type checkpoint struct {
	loaded bool
	seq    uint64
	stamp  uint64 // an async bucket's last sequence when it was written (persist.go)
	rev    uint64 // 0: the key does not exist
}

// saveCheckpoint raises the checkpoint key to seq, after the views it covers
// are stored; a checkpoint at or above seq stays. wmu is held (or v is not
// shared yet).
func (v *View) saveCheckpoint(ctx context.Context, seq uint64) error {
	// One answer waited for AckTimeout at most, as the writer's reads and
	// writes are (load): not the hold timer's 30 s.
	ctx, cancel := context.WithTimeout(ctx, v.cfg.AckTimeout)
	defer cancel()
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
		var stamp uint64
		if v.async {
			last, err := v.lastSeq(ctx)
			if err != nil {
				return fmt.Errorf("put checkpoint %d: %w", seq, err)
			}
			stamp = last
		}
		val := checkpointValue(seq, stamp, v.async)
		var rev uint64
		var err error
		if v.cp.rev == 0 {
			rev, err = v.pos.Create(ctx, v.cpKey, val) // also over a deleted key
		} else {
			rev, err = v.pos.Update(ctx, v.cpKey, val, v.cp.rev)
		}
		if err == nil {
			v.cp = checkpoint{loaded: true, seq: seq, stamp: stamp, rev: rev}
			return nil
		}
		v.cp = checkpoint{}
		moved := errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
		if !moved || try >= conflictRetries {
			return fmt.Errorf("put checkpoint %d: %w", seq, err)
		}
	}
}

// readCheckpoint reads the checkpoint key; rev is 0 when there is none.
func (v *View) readCheckpoint(ctx context.Context) (checkpoint, error) {
	e, err := v.pos.Get(ctx, v.cpKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return checkpoint{loaded: true}, nil
	case err != nil:
		return checkpoint{}, fmt.Errorf("get checkpoint %s: %w", v.cpKey, err)
	}
	seq, stamp, err := parseCheckpoint(string(e.Value()))
	if err != nil {
		// Garbage (the bucket is on the bus): the view applies the log
		// again from its start, which it does idempotently, and the next
		// checkpoint overwrites the key (at its revision).
		v.garbage.Add(1)
		return checkpoint{loaded: true, rev: e.Revision()}, nil
	}
	return checkpoint{loaded: true, seq: seq, stamp: stamp, rev: e.Revision()}, nil
}

// migrate moves a checkpoint an older build left in the view's bucket under
// legacyKey to the positions bucket: the new key takes its value unless it
// holds a higher one already, then the old key is deleted. A crash between
// the two leaves both, and the next New finishes the move. v is not shared
// yet.
func (v *View) migrate(ctx context.Context) error {
	e, err := v.kv.Get(ctx, legacyKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("get %s: %w", legacyKey, err)
	}
	seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return fmt.Errorf("%s rev %d: %w", legacyKey, e.Revision(), err)
	}
	if err := v.saveCheckpoint(ctx, seq); err != nil {
		return fmt.Errorf("move %s: %w", legacyKey, err)
	}
	if err := v.kv.Delete(ctx, legacyKey); err != nil {
		return fmt.Errorf("delete %s: %w", legacyKey, err)
	}
	return nil
}

// forgetStale deletes the checkpoint of a view bucket that has never been
// written: it was left by an earlier bucket of the same name (deleted, as a
// failed rebuild's is), and would put the checkpoint ahead of the views. At
// worst the checkpoint of a view whose events changed no view yet goes back
// to 0, and those events are read again. v is not shared yet.
func (v *View) forgetStale(ctx context.Context) error {
	s, err := v.js.Stream(ctx, "KV_"+v.cfg.Bucket)
	if err != nil {
		return fmt.Errorf("stream of %s: %w", v.cfg.Bucket, err)
	}
	if s.CachedInfo().State.LastSeq != 0 {
		return nil
	}
	cp, err := v.readCheckpoint(ctx)
	if err != nil || cp.rev == 0 {
		return err
	}
	if err := v.pos.Delete(ctx, v.cpKey, jetstream.LastRevision(cp.rev)); err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("delete stale checkpoint %s: %w", v.cpKey, err)
	}
	return nil
}
