package kvview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/projections"
)

// conflictRetries bounds how often ApplyBatch reloads views that another
// writer changed under it.
const conflictRetries = 3

// writeWindow bounds the puts in flight at once, below the jetstream
// context's default limit of 4000 pending async publishes.
const writeWindow = 1000

// writeTimeout bounds the wait for the acknowledgements of one batch's puts
// when the caller's context has no deadline.
const writeTimeout = 30 * time.Second

// DefaultAckTimeout bounds the wait for one put's acknowledgement, once the
// puts before it are acknowledged (Config.AckTimeout). An asynchronous
// publish whose stream's leader dies under it is never answered: neither an
// acknowledgement nor an error comes (nats.go's future waits for ever).
// Without this bound the writer held its lock for writeTimeout, and the
// view stood still for 30 s after a NATS server was killed. A put not
// acknowledged is tried again, on the revision it was made on: if it did
// land, the retry finds the key moved and folds onto it. Not shorter: a
// put given up on stays among the connection's pending publishes until its
// late acknowledgement comes, and a rebuild's retries over a server slowed
// to seconds per acknowledgement (CI under the race detector) filled them
// up to nats.go's limit of 4000 at 5 s.
const DefaultAckTimeout = 10 * time.Second

// Apply folds env into its sandbox's view and stores the result: ApplyBatch
// of one event.
func (v *View) Apply(ctx context.Context, env events.Envelope) error {
	return v.ApplyBatch(ctx, []events.Envelope{env})
}

// ApplyBatch folds envs (stream order) into their sandboxes' views and
// stores each changed view once, however many of its events the batch
// holds, then the checkpoint (see Checkpoint). An event a view already holds
// (a seq at or below the view's) or of an unknown type changes nothing, so
// redeliveries are harmless.
//
// The writes go out pipelined (async publishes on the keys' subjects, at
// most writeWindow in flight) and ApplyBatch returns only when all of them
// are acknowledged. Each write is conditional on the revision of the view it
// folded into (the expected last sequence of the key's subject), so a view
// in the bucket never goes back in seq:
//   - one batch writes a key at most once, and a batch's writes are all
//     acknowledged before the next batch's are sent, so the writes of one
//     key by one writer land in the order of the log;
//   - a write that failed or whose answer was lost may still land later; it
//     was sent before any retry on the same connection, so the server
//     stores it first, and the retry's conditional write then fails and
//     reloads instead of overwriting it;
//   - another writer (there should be none but the runner) makes a write
//     fail its condition; the view is reloaded, folded again and written,
//     up to conflictRetries times.
//
// With Config.HoldTransient, a view whose new phase is transient is not
// written yet: its events are kept and folded again with the sandbox's next
// ones, or written by a timer when the hold is up. The checkpoint stays
// below every held event.
//
// A sandbox missing from the cache is read from the bucket, except when its
// first event in the batch is sandbox.created: then it is new, and its write
// is conditional on the key not existing (a redelivered creation fails that
// and is reloaded). On any error, the cached views of the batch are dropped,
// so the retry reads them from the bucket.
func (v *View) ApplyBatch(ctx context.Context, envs []events.Envelope) error {
	if len(envs) == 0 {
		return nil
	}
	v.wmu.Lock()
	defer v.wmu.Unlock()

	var top uint64
	index := make(map[string]int, len(envs))
	var groups []group
	for _, env := range envs {
		id := env.SandboxID
		if !viewKey(id) {
			return fmt.Errorf("apply %s seq %d: sandbox id %q cannot be a key of the view: %w", env.Type, env.Seq, id, projections.ErrUnapplicable)
		}
		if env.Seq == 0 { // Fold would take it and set the view's seq back to 0
			return fmt.Errorf("apply %s to %s: no stream sequence", env.Type, id)
		}
		top = max(top, env.Seq)
		i, ok := index[id]
		if !ok {
			i = len(groups)
			index[id] = i
			groups = append(groups, group{id: id})
		}
		groups[i].envs = append(groups[i].envs, env)
	}
	for i, g := range groups {
		if h, ok := v.held[g.id]; ok {
			groups[i].envs = append(h.envs[:len(h.envs):len(h.envs)], g.envs...)
			groups[i].since = h.since
		}
	}
	held, moves, err := v.applyGroups(ctx, groups, v.cfg.HoldTransient)
	if err != nil {
		for _, g := range groups {
			v.forget(g.id)
		}
		return fmt.Errorf("apply seq %d to %d: %w", envs[0].Seq, envs[len(envs)-1].Seq, err)
	}
	for _, g := range groups {
		delete(v.held, g.id)
	}
	for _, g := range held {
		v.held[g.id] = g
	}
	v.armLocked()
	v.applied = max(v.applied, top)
	for _, ms := range moves {
		for _, m := range ms {
			v.cfg.Metrics.Transition(string(m.from), string(m.to))
		}
	}
	v.counted = max(v.counted, top)
	if v.cfg.CheckpointEvery > 0 && time.Since(v.savedAt) < v.cfg.CheckpointEvery {
		return nil
	}
	if err := v.checkpointLocked(ctx); err != nil {
		return fmt.Errorf("apply seq %d to %d: %w", envs[0].Seq, envs[len(envs)-1].Seq, err)
	}
	return nil
}

// Flush writes every held view and then the checkpoint of everything
// applied, when CheckpointEvery left some of it unwritten. The runner calls
// it when it stops.
func (v *View) Flush(ctx context.Context) error {
	v.wmu.Lock()
	defer v.wmu.Unlock()
	if err := v.writeHeldLocked(ctx, true); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	if err := v.checkpointLocked(ctx); err != nil {
		return fmt.Errorf("flush checkpoint: %w", err)
	}
	return nil
}

// checkpointLocked raises the checkpoint to what was applied, short of
// the first held event. wmu is held.
func (v *View) checkpointLocked(ctx context.Context) error {
	seq := v.applied
	for _, g := range v.held {
		seq = min(seq, g.envs[0].Seq-1)
	}
	if err := v.saveCheckpoint(ctx, seq); err != nil {
		return err
	}
	v.savedAt = time.Now()
	return nil
}

// writeHeldLocked writes the held views whose hold is up, or all of them.
// Views it could not write stay held for another HoldTransient. wmu is
// held.
func (v *View) writeHeldLocked(ctx context.Context, all bool) error {
	now := time.Now()
	var due []group
	for _, g := range v.held {
		if all || now.Sub(g.since) >= v.cfg.HoldTransient {
			due = append(due, g)
		}
	}
	if len(due) == 0 {
		return nil
	}
	_, _, err := v.applyGroups(ctx, due, 0) // what it folds was counted when first applied
	for _, g := range due {
		if err != nil {
			v.forget(g.id)
			g.since = now
			v.held[g.id] = g
			continue
		}
		delete(v.held, g.id)
	}
	v.armLocked()
	return err
}

// armLocked sets the timer to write the held views when the first hold is
// up. wmu is held.
func (v *View) armLocked() {
	if len(v.held) == 0 {
		if v.timer != nil {
			v.timer.Stop()
		}
		return
	}
	var first time.Time
	for _, g := range v.held {
		if first.IsZero() || g.since.Before(first) {
			first = g.since
		}
	}
	d := time.Until(first.Add(v.cfg.HoldTransient))
	if v.timer == nil {
		v.timer = time.AfterFunc(d, v.holdUp)
		return
	}
	v.timer.Reset(d)
}

// holdUp is the timer's work: write the views whose hold is up. A failure
// keeps them held; the next batch or timer tries again.
func (v *View) holdUp() {
	v.wmu.Lock()
	defer v.wmu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	_ = v.writeHeldLocked(ctx, false)
}

// group is the events of one sandbox in a batch.
type group struct {
	id   string
	envs []events.Envelope
	// since is when the first of envs was held back (HoldTransient); zero
	// while none is.
	since time.Time
}

// write is one view to put under revision rev (0: the key must not exist).
type write struct {
	id   string
	view events.View
	data []byte
	rev  uint64
}

// move is a change of a sandbox's phase an event made.
type move struct{ from, to events.Phase }

// applyGroups folds and writes every group, reloading and retrying those
// whose key another write changed. With hold, a group whose view goes to a
// transient phase, and was not held for hold already, is not written but
// returned. With Config.Metrics, moves are the phase changes, by sandbox,
// of the events above v.counted, as the last fold of each group made them.
func (v *View) applyGroups(ctx context.Context, todo []group, hold time.Duration) (held []group, moves map[string][]move, err error) {
	now := time.Now()
	for try := 0; ; try++ {
		writes := make([]write, 0, len(todo))
		for _, g := range todo {
			cur, err := v.base(ctx, g, try == 0)
			if err != nil {
				return nil, nil, err
			}
			next, changed, ms, err := v.foldGroup(cur.view, g)
			if err != nil {
				// A cached view may be behind the bucket (another writer):
				// the bucket's decides whether the table refuses.
				if fresh, rev, lerr := v.load(ctx, g.id); lerr == nil && rev != cur.rev {
					v.forget(g.id)
					cur = entry{view: fresh, rev: rev}
					next, changed, ms, err = v.foldGroup(cur.view, g)
				}
			}
			if err != nil {
				// Refused by the lifecycle table (or its data does not
				// decode): the aggregate passed over it, so no view may
				// follow it. The runner parks it and goes on.
				return nil, nil, fmt.Errorf("%w: %w", projections.ErrUnapplicable, err)
			}
			if v.cfg.Metrics != nil {
				if moves == nil {
					moves = map[string][]move{}
				}
				moves[g.id] = ms
			}
			if !changed {
				continue
			}
			if try == 0 && hold > 0 && next.Phase.Transient() && (g.since.IsZero() || now.Sub(g.since) < hold) {
				if g.since.IsZero() {
					g.since = now
				}
				held = append(held, g)
				continue
			}
			data, err := json.Marshal(next)
			if err != nil {
				return nil, nil, fmt.Errorf("encode view %s: %w", g.id, err)
			}
			writes = append(writes, write{id: g.id, view: next, data: data, rev: cur.rev})
		}
		moved, err := v.put(ctx, writes, true)
		if err != nil {
			return nil, nil, err
		}
		if len(moved) == 0 {
			return held, moves, nil
		}
		if try >= conflictRetries {
			return nil, nil, fmt.Errorf("%d views changed under the writer %d times: %w", len(moved), try+1, jetstream.ErrKeyRevisionMismatch)
		}
		redo := todo[:0:0]
		for _, g := range todo {
			if moved[g.id] {
				redo = append(redo, g)
			}
		}
		todo = redo
	}
}

// foldGroup folds g's events into view (Fold replaces Labels and ExitCode,
// never edits them) and says whether it changed, with the phase changes of
// the events above v.counted (Config.Metrics), or the error of an event
// the lifecycle table refuses.
func (v *View) foldGroup(view events.View, g group) (events.View, bool, []move, error) {
	changed := false
	var ms []move
	for _, env := range g.envs {
		from := view.Phase
		took, err := view.Apply(env)
		if err != nil {
			return view, false, nil, fmt.Errorf("apply %s seq %d to %s: %w", env.Type, env.Seq, g.id, err)
		}
		changed = took || changed
		if view.Phase != from && env.Seq > v.counted && v.cfg.Metrics != nil {
			ms = append(ms, move{from, view.Phase})
		}
	}
	return view, changed, ms, nil
}

// base is the view g's events fold into: the cached one, an empty one for a
// sandbox the batch creates (when assumeNew), else the bucket's.
func (v *View) base(ctx context.Context, g group, assumeNew bool) (entry, error) {
	v.mu.Lock()
	p, ok := v.cache[g.id]
	v.mu.Unlock()
	if ok {
		return p.entry(), nil
	}
	if assumeNew && g.envs[0].Type == events.TypeCreated { // the first event of every sandbox
		return entry{}, nil
	}
	view, rev, err := v.load(ctx, g.id)
	if errors.Is(err, events.ErrNotFound) {
		return entry{}, nil
	}
	if errors.Is(err, ErrGarbage) {
		// Not a view: rebuilt from the log up to g's first event, and
		// written over the garbage (at its revision).
		view, err := v.rebuildOne(ctx, g.id, g.envs[0].Seq)
		if err != nil {
			return entry{}, err
		}
		return entry{view: view, rev: rev}, nil
	}
	if err != nil {
		return entry{}, err
	}
	return entry{view: view, rev: rev}, nil
}

// rebuildOne folds the view of id from the log, through the lifecycle
// table, from its first event to the one before seq; without Config.Log
// it is no view yet.
func (v *View) rebuildOne(ctx context.Context, id string, seq uint64) (events.View, error) {
	var view events.View
	if v.cfg.Log == nil {
		return view, nil
	}
	envs, err := v.cfg.Log.Load(ctx, id, 0)
	if err != nil {
		return view, fmt.Errorf("rebuild the view of %s: %w", id, err)
	}
	for _, env := range envs {
		if env.Seq >= seq {
			break
		}
		_, _ = view.Apply(env) // what the table refuses, the live view parked
	}
	return view, nil
}

// put publishes writes pipelined and waits for every acknowledgement. A
// write refused because its key moved is forgotten and reported in moved;
// any other failure is returned. Acknowledged writes are cached if cache.
func (v *View) put(ctx context.Context, writes []write, cache bool) (moved map[string]bool, err error) {
	if len(writes) == 0 {
		return nil, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, writeTimeout)
		defer cancel()
	}
	futures := make([]jetstream.PubAckFuture, 0, len(writes))
	acked := 0
	// settle waits for the acknowledgement of writes[acked].
	settle := func() error {
		w, f := writes[acked], futures[acked]
		acked++
		t := time.NewTimer(v.cfg.AckTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			v.forget(w.id)
			return fmt.Errorf("put %s: %w", w.id, events.Errorf(events.CodeUnavailable, "no acknowledgement within %s", v.cfg.AckTimeout))
		case ack := <-f.Ok():
			if cache {
				v.remember(w.id, entry{view: w.view, rev: ack.Sequence})
			}
			return nil
		case err := <-f.Err():
			v.forget(w.id)
			if isRevisionMismatch(err) {
				if moved == nil {
					moved = map[string]bool{}
				}
				moved[w.id] = true
				return nil
			}
			return fmt.Errorf("put %s: %w", w.id, err)
		case <-ctx.Done():
			return fmt.Errorf("put %s: %w", w.id, ctx.Err())
		}
	}
	for _, w := range writes {
		if len(futures)-acked >= writeWindow {
			if err := settle(); err != nil {
				return nil, err
			}
		}
		msg := &nats.Msg{Subject: v.pre + w.id, Data: w.data, Header: nats.Header{}}
		f, err := v.js.PublishMsgAsync(msg, jetstream.WithExpectLastSequencePerSubject(w.rev))
		if err != nil {
			return nil, fmt.Errorf("put %s: %w", w.id, err)
		}
		futures = append(futures, f)
	}
	for acked < len(futures) {
		if err := settle(); err != nil {
			return nil, err
		}
	}
	return moved, nil
}

// isRevisionMismatch reports whether err says a conditional write found its
// key at another revision.
func isRevisionMismatch(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

func (v *View) remember(id string, e entry) {
	p := pack(e)
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.cache[id]; !ok && len(v.cache) >= v.cfg.CacheSize {
		for k := range v.cache { // evict one arbitrary entry
			delete(v.cache, k)
			break
		}
	}
	v.cache[id] = p
}

func (v *View) forget(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.cache, id)
}
