package kvview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/projections"
)

// Rebuild with a swap. The issue asks for a new bucket swapped in under the
// contract's name, torpor_phases; NATS KV buckets cannot be renamed, and a
// bucket deleted and made again under that name would be missing, or
// empty, for a moment. So the rebuilt bucket is not swapped in: its views
// are brought into the contract's bucket, key by key, while the live writer
// is paused. Every key goes from its old view straight to its rebuilt one,
// never through a missing one, and readers go on reading torpor_phases all
// along, in this process and elsewhere (nats kv get, watchers, which see
// each change as an update):
//
//  1. fold: read the whole log (Replay) and fold it into views in memory,
//     while the live projection goes on;
//  2. write: put them into a new bucket, <bucket>_rebuild_<n>, with their
//     checkpoint (as Rebuild does);
//  3. catchup: fold the events appended meanwhile into the new bucket
//     (ApplyBatch from its checkpoint), round after round until a round
//     finds few;
//  4. swap, under the live writer's lock (its ApplyBatch, Flush and hold
//     timer wait meanwhile; readers do not):
//     a. catch the new bucket up to the log's head, which is at or above
//     everything the live writer applied, held views included;
//     b. compare the two buckets and write into the live one each view that
//     differs, conditional on the revision read (nothing else should
//     write it), then delete the live keys the log has no sandbox for;
//     c. drop the writer's cached views and held events (the new views hold
//     them) and raise the checkpoint to the new bucket's;
//     d. release the lock, then delete the new bucket and its checkpoint.
//
// A view never goes back in seq: the live bucket's view of a sandbox folds
// a prefix of its events up to the live writer's position, the new one all
// of them up to the head, so its seq is the same or higher; a rebuild after
// a bug fix may change a view at the same seq. The live runner continues
// from its own position, at or below the new checkpoint; ApplyBatch skips
// what a view holds already, so the events in between change nothing and
// the later ones apply as before. While the swap runs the live writer
// applies nothing: the view lags for as long as step 4 takes (a read of
// both buckets, the differing writes), and catches up after.
//
// A rebuild of the past (RebuildOptions.Until or UntilTime, of package
// projections, whose log, phases and progress every view shares) folds the log
// up to that sequence into <bucket>_at_<seq>, for audit beside the live
// bucket; it is never swapped in, and a second build of the same sequence
// is ALREADY_EXISTS.

// SwapStats say what View.Rebuild did.
type SwapStats struct {
	RebuildStats
	// Bucket is where the rebuilt views are: the live bucket after a swap,
	// <bucket>_at_<seq> for the past.
	Bucket string
	// Changed is how many views of the live bucket the swap wrote, Deleted
	// how many keys it deleted: 0 and 0 when the live view was right.
	Changed, Deleted int
	// CatchUp and Swap are the times those phases took; Paused how long the
	// live writer waited.
	CatchUp, Swap, Paused time.Duration
}

// catchUpFew is the number of events below which a catch-up round is the
// last before the swap.
const catchUpFew = 1000

// PastBucket is the bucket of the view of the past at seq.
func (v *View) PastBucket(seq uint64) string {
	return v.cfg.Bucket + "_at_" + strconv.FormatUint(seq, 10)
}

// Rebuild rebuilds v from src (see the protocol above): into a new bucket
// whose views are then brought into v's bucket, or with opts.Until or
// opts.UntilTime, into the bucket of the past, never swapped in. An Until
// past the log's last sequence, or a time before its first event, is
// INVALID_ARGUMENT.
func (v *View) Rebuild(ctx context.Context, src projections.Log, opts projections.RebuildOptions) (SwapStats, error) {
	var st SwapStats
	report := opts.Progress
	if report == nil {
		report = func(projections.Progress) {}
	}
	head, err := src.LastSeq(ctx)
	if err != nil {
		return st, fmt.Errorf("rebuild: %w", err)
	}
	past := opts.Until != 0 || !opts.UntilTime.IsZero()
	if opts.Until > head {
		return st, events.Errorf(events.CodeInvalidArgument, "rebuild until %d: the log ends at %d", opts.Until, head)
	}
	if opts.Until != 0 {
		if err := v.pastFree(ctx, opts.Until); err != nil {
			return st, err
		}
	}
	total := head
	if opts.Until != 0 {
		total = opts.Until
	}

	start := time.Now()
	views, n, last, err := foldUntil(ctx, src, opts.Until, opts.UntilTime, func(last uint64) {
		report(projections.Progress{Phase: projections.PhaseFold, Done: last, Total: total})
	})
	if err != nil {
		return st, fmt.Errorf("rebuild: fold: %w", err)
	}
	switch {
	case opts.Until != 0:
		last = opts.Until
	case past && last == 0:
		return st, events.Errorf(events.CodeInvalidArgument, "rebuild until %s: no event of the log is that old",
			opts.UntilTime.Format(time.RFC3339Nano))
	case past:
		if err := v.pastFree(ctx, last); err != nil {
			return st, err
		}
	}
	for id, view := range views {
		if view.Seq == 0 { // no event of it folded: the live writer writes no view either
			delete(views, id)
		}
	}
	st.Events, st.LastSeq, st.Fold = n, last, time.Since(start)

	bucket := v.cfg.Bucket + "_rebuild_" + strconv.FormatInt(time.Now().UnixNano(), 10)
	if past {
		bucket = v.PastBucket(last)
	}
	start = time.Now()
	report(projections.Progress{Phase: projections.PhaseWrite, Done: last, Total: total})
	// Its values expire (and Reap removes it) after PastTTL: a view of the
	// past is kept that long for audit; a swap's is deleted once swapped.
	nv, err := New(ctx, v.js, Config{Bucket: bucket, Replicas: v.cfg.Replicas, MaxBytes: v.cfg.MaxBytes, TTL: v.cfg.PastTTL})
	if err != nil {
		return st, fmt.Errorf("rebuild: %w", err)
	}
	kept := false
	defer func() {
		if !kept {
			nv.drop()
		}
	}()
	if st.Views, err = nv.writeAll(ctx, views); err != nil {
		return st, fmt.Errorf("rebuild %s: %w", bucket, err)
	}
	if err := nv.saveCheckpoint(ctx, last); err != nil {
		return st, fmt.Errorf("rebuild %s: %w", bucket, err)
	}
	views = nil
	st.Write = time.Since(start)
	if past {
		kept = true
		st.Bucket = bucket
		report(projections.Progress{Phase: projections.PhaseDone, Done: last, Total: total})
		return st, nil
	}

	start = time.Now()
	rounds := opts.CatchUpRounds
	if rounds <= 0 {
		rounds = 5
	}
	for range rounds {
		n, err := nv.catchUp(ctx, src, &st.LastSeq, report)
		st.Events += n
		if err != nil {
			return st, fmt.Errorf("rebuild %s: catch up: %w", bucket, err)
		}
		if n < catchUpFew {
			break
		}
	}
	st.CatchUp = time.Since(start)

	start = time.Now()
	if err := v.swap(ctx, nv, src, &st, report); err != nil {
		return st, fmt.Errorf("rebuild %s: swap: %w", bucket, err)
	}
	st.Swap = time.Since(start)
	st.Bucket = v.cfg.Bucket
	report(projections.Progress{Phase: projections.PhaseDone, Done: st.LastSeq, Total: st.LastSeq})
	return st, nil
}

// pastFree returns ALREADY_EXISTS when the bucket of the past at seq
// exists.
func (v *View) pastFree(ctx context.Context, seq uint64) error {
	_, err := v.js.KeyValue(ctx, v.PastBucket(seq))
	switch {
	case err == nil:
		return events.Errorf(events.CodeAlreadyExists, "the view at seq %d exists already: bucket %s", seq, v.PastBucket(seq))
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return nil
	default:
		return fmt.Errorf("rebuild: bucket %s: %w", v.PastBucket(seq), err)
	}
}

// drop deletes v's bucket and its checkpoint: what a failed rebuild left.
func (v *View) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = v.js.DeleteKeyValue(ctx, v.cfg.Bucket)
	_ = v.pos.Delete(ctx, v.cpKey)
}

// catchUp applies the events after *last to v (a rebuild's bucket) and
// returns how many it read.
func (v *View) catchUp(ctx context.Context, src projections.Log, last *uint64, report func(projections.Progress)) (int, error) {
	total, err := src.LastSeq(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	end, err := src.Replay(ctx, *last+1, func(envs []events.Envelope) error {
		if err := v.applyParking(ctx, envs); err != nil {
			return err
		}
		n += len(envs)
		*last = max(*last, envs[len(envs)-1].Seq)
		report(projections.Progress{Phase: projections.PhaseCatchUp, Done: *last, Total: max(total, *last)})
		return nil
	})
	if err != nil {
		return n, err
	}
	if end > *last { // the log ends with messages that are not events
		*last = end
		v.wmu.Lock()
		err = v.saveCheckpoint(ctx, end)
		v.wmu.Unlock()
	}
	return n, err
}

// applyParking is ApplyBatch of envs that parks the events the view can
// never apply (the table refuses them, say) and applies the rest, as the
// runner does for the live view.
func (v *View) applyParking(ctx context.Context, envs []events.Envelope) error {
	err := v.ApplyBatch(ctx, envs)
	if !errors.Is(err, projections.ErrUnapplicable) {
		return err
	}
	for _, env := range envs {
		err := v.Apply(ctx, env)
		if errors.Is(err, projections.ErrUnapplicable) {
			err = v.Park(ctx, env, err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// swap brings the views of nv, a rebuild's bucket, into v's bucket with v's
// writer paused (step 4 of the protocol), then deletes nv's bucket.
func (v *View) swap(ctx context.Context, nv *View, src projections.Log, st *SwapStats, report func(projections.Progress)) error {
	v.wmu.Lock()
	paused := time.Now()
	err := func() error {
		defer v.wmu.Unlock()
		report(projections.Progress{Phase: projections.PhaseSwap, Done: st.LastSeq, Total: max(st.LastSeq, v.applied)})
		n, err := nv.catchUp(ctx, src, &st.LastSeq, func(projections.Progress) {})
		st.Events += n
		if err != nil {
			return fmt.Errorf("catch up: %w", err)
		}
		if v.applied > st.LastSeq {
			return fmt.Errorf("the live view applied seq %d, beyond the log's %d", v.applied, st.LastSeq)
		}
		fresh, err := rawAll(ctx, nv.kv)
		if err != nil {
			return err
		}
		live, err := rawAll(ctx, v.kv)
		if err != nil {
			return err
		}
		var writes []write
		for id, e := range fresh {
			if e.deleted {
				continue
			}
			if l, ok := live[id]; !ok || l.deleted || !slices.Equal(l.value, e.value) {
				writes = append(writes, write{id: id, data: e.value, rev: l.rev})
			}
		}
		moved, err := v.put(ctx, writes, false)
		if err != nil {
			return err
		}
		if len(moved) > 0 {
			return fmt.Errorf("%d keys of %s written by someone else during the swap: %w", len(moved), v.cfg.Bucket, jetstream.ErrKeyExists)
		}
		st.Changed = len(writes)
		for id, l := range live {
			if f, ok := fresh[id]; l.deleted || (ok && !f.deleted) {
				continue
			}
			if err := v.kv.Delete(ctx, id, jetstream.LastRevision(l.rev)); err != nil {
				return fmt.Errorf("delete %s: %w", id, err)
			}
			st.Deleted++
		}
		v.mu.Lock()
		v.cache = make(map[string]packed)
		v.mu.Unlock()
		clear(v.held)
		v.armLocked()
		v.applied = max(v.applied, st.LastSeq)
		return v.checkpointLocked(ctx)
	}()
	st.Paused = time.Since(paused)
	if err != nil {
		return err
	}
	nv.drop()
	return nil
}

// raw is one key's last entry: its value and revision, or a delete.
type raw struct {
	value   []byte
	rev     uint64
	deleted bool
}

// rawAll reads the last entry of every view key of kv, deletes included.
func rawAll(ctx context.Context, kv jetstream.KeyValue) (map[string]raw, error) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", kv.Bucket(), err)
	}
	defer stop(w)
	out := map[string]raw{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("watch %s: closed", kv.Bucket())
			}
			if e == nil {
				return out, nil
			}
			if !viewKey(e.Key()) {
				continue
			}
			out[e.Key()] = raw{value: e.Value(), rev: e.Revision(), deleted: e.Operation() != jetstream.KeyValuePut}
		}
	}
}

// foldUntil reads the log of src (up to until, or to the first event after
// untilTime, when set) into one view per sandbox, as fold does, calling
// each with the last sequence folded after every chunk.
func foldUntil(ctx context.Context, src Replayer, until uint64, untilTime time.Time, each func(last uint64)) (views map[string]*events.View, n int, last uint64, err error) {
	views = make(map[string]*events.View)
	chunks := make(chan []events.Envelope, rebuildChunks)
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
				last = max(last, env.Seq)
			}
			n += len(chunk)
			each(last)
		}
	}()
	end, cut, err := projections.ReplayUntil(ctx, src, until, untilTime, chunks)
	close(chunks)
	<-folded
	switch {
	case err != nil:
		return nil, 0, 0, err
	case !cut && until == 0 && untilTime.IsZero():
		last = max(last, end)
	}
	return views, n, last, nil
}
