package kvview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// Follower serves the waits and watches of one process from one watch of
// the bucket: every view change is read once and handed, in memory, to the
// waits of its sandbox and to every watch, so that neither costs a consumer
// on the server per request (View.Wait and View.Watch make one per call).
// Make one with View.Follow.
//
// What it keeps: the last ringSize changes in the order it saw them (a
// watch resumed with the seq of one of them replays the rest from memory),
// and for each key changed among them its latest value (a wait on it
// answers without a read of the bucket). So what it holds is bounded by
// ringSize values, whatever the size of the fleet: a sandbox idle for
// longer is read from the bucket. Both are dropped whenever its watch is
// lost, since the changes in between are not in them.
type Follower struct {
	v *View

	mu    sync.Mutex
	waits map[string]map[*waiter]struct{} // by sandbox id
	// back is closed, and replaced, each time the watch (again) delivers
	// changes: a wait then reads its view afresh, for what it missed.
	back   chan struct{}
	latest map[string]latest // key → its value, as the watch delivered it
	ring   []change          // the last changes seen, oldest first, ringSize at most
	head   int               // where the next change goes once ring is full
	subs   map[*sub]struct{}
	up     chan struct{} // closed once the follower's watch is first up
	pulls  chan struct{} // the watches' snapshot pulls under way (snapshotPulls)
	// pullBytes is what one pull asks for (snapshotBytes; a test makes
	// both smaller, with the server's pending limit).
	pullBytes int
	n         uint64 // changes delivered
}

// latest is the last value of a key the follower saw, and its view once
// decoded (for a wait: each value is decoded at most once here).
type latest struct {
	n    uint64 // the change's number (change.n)
	raw  []byte
	view *events.View
}

// change is one value the follower's watch delivered.
type change struct {
	key string
	raw []byte
	n   uint64 // its number in the follower's order, from 1
}

// waiter is one wait's queue of the views of its sandbox, newest last.
type waiter struct {
	ch chan events.View
}

// sub is one watch's queue of changes. The follower closes ch when the
// watch falls subQueue changes behind, or when the follower's own watch was
// lost: the watch then ends, and its client resumes from its last seq.
type sub struct {
	ch     chan change
	closed bool
}

const (
	// waiterQueue is how many changes of its sandbox one wait holds before
	// it reads them; an overflow drops the oldest (the newest is what a
	// wait decides on, and each view holds the whole state of its sandbox).
	waiterQueue = 16
	// subQueue is how far behind the follower a watch may fall before it is
	// ended (its client resumes with Last-Event-ID).
	subQueue = 4096
	// ringSize is how many recent changes a resumed watch can be served
	// from without reading the bucket.
	ringSize = 4096
)

// followRetry is the wait before the follower watches the bucket again
// after its watch ended.
const followRetry = 250 * time.Millisecond

// Follow starts the follower of v's bucket, which runs until ctx ends.
func (v *View) Follow(ctx context.Context) *Follower {
	f := v.Follower()
	go f.run(ctx)
	return f
}

// Follower is the follower of v's bucket, not running yet: Run runs it
// (a node's part, which stops in its order and is waited for).
func (v *View) Follower() *Follower {
	return &Follower{v: v, waits: map[string]map[*waiter]struct{}{}, back: make(chan struct{}),
		latest: map[string]latest{}, subs: map[*sub]struct{}{}, up: make(chan struct{}),
		pulls: make(chan struct{}, snapshotPulls), pullBytes: snapshotBytes}
}

// Run runs the follower until ctx ends, and returns once it stopped (every
// watch of it ended).
func (f *Follower) Run(ctx context.Context) error {
	f.run(ctx)
	return nil
}

// run watches the bucket's changes and hands each to its waits; when the
// watch ends it watches again, and once it is back every wait reads its
// sandbox's view afresh, so that a change in between is not missed.
func (f *Follower) run(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := f.v.kv.WatchAll(ctx, jetstream.IgnoreDeletes(), jetstream.UpdatesOnly())
		if err == nil {
			f.mu.Lock()
			close(f.back) // every wait reads its view again
			f.back = make(chan struct{})
			f.forget()
			f.mu.Unlock()
			select {
			case <-f.up:
			default:
				close(f.up)
			}
			f.follow(ctx, w)
			stop(w)
		}
		select {
		case <-ctx.Done():
		case <-time.After(followRetry):
		}
	}
	f.mu.Lock()
	f.forget()
	f.mu.Unlock()
}

// forget drops what the follower keeps and ends every watch: it may have
// missed changes (its watch was lost), so none of it is known to be whole.
// The caller holds f.mu.
func (f *Follower) forget() {
	clear(f.latest)
	f.ring, f.head = f.ring[:0], 0
	for s := range f.subs {
		f.end(s)
	}
}

// end closes s's queue once; the caller holds f.mu.
func (f *Follower) end(s *sub) {
	if !s.closed {
		s.closed = true
		close(s.ch)
	}
	delete(f.subs, s)
}

// follow hands the changes w delivers to their waits until w or ctx ends.
func (f *Follower) follow(ctx context.Context, w jetstream.KeyWatcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil || !viewKey(e.Key()) {
				continue
			}
			f.deliver(change{key: e.Key(), raw: e.Value()})
		}
	}
}

// deliver keeps c and hands it to the waits of its key and every watch.
// Only a key somebody waits on is decoded here; watches decode their own.
func (f *Follower) deliver(c change) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	c.n = f.n
	if len(f.ring) < ringSize {
		f.ring = append(f.ring, c)
	} else {
		// The oldest change leaves the ring, and its key's latest value
		// with it unless the key changed again since.
		if old := f.ring[f.head]; f.latest[old.key].n == old.n {
			delete(f.latest, old.key)
		}
		f.ring[f.head] = c
		f.head = (f.head + 1) % ringSize
	}
	f.latest[c.key] = latest{n: c.n, raw: c.raw}
	for s := range f.subs {
		select {
		case s.ch <- c:
		default: // too far behind: ended, its client resumes
			f.end(s)
		}
	}
	if len(f.waits[c.key]) == 0 {
		return // nobody waits: not even decoded
	}
	var view events.View
	if json.Unmarshal(c.raw, &view) != nil {
		return
	}
	f.latest[c.key] = latest{n: c.n, raw: c.raw, view: &view}
	for w := range f.waits[c.key] {
		w.put(view)
	}
}

// put queues view, dropping the oldest queued one when the queue is full.
func (w *waiter) put(view events.View) {
	for {
		select {
		case w.ch <- view:
			return
		default:
		}
		select {
		case <-w.ch:
		default:
		}
	}
}

// Wait is View.Wait served by the follower: it returns the view of sandbox
// id as soon as its phase is phase at a sequence above after, a
// FAILED_PRECONDITION error when it reached another terminal phase, and
// when ctx ends the last view it saw with an error wrapping ctx.Err(). An
// id the bucket does not hold yet is waited for.
func (f *Follower) Wait(ctx context.Context, id string, phase events.Phase, after uint64) (events.View, error) {
	return f.until(ctx, id, after, "be "+string(phase), func(view events.View) (bool, error) {
		switch {
		case view.Phase == phase:
			return true, nil
		case view.Phase.Terminal():
			return true, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s; it will never be %s", id, view.Phase, phase)
		}
		return false, nil
	})
}

// Settle is View.Settle served by the follower: it returns the first view
// of sandbox id at a sequence above after whose phase is not transient,
// the outcome of a command answered at after+1; when ctx ends, the last
// view it saw with an error wrapping ctx.Err().
func (f *Follower) Settle(ctx context.Context, id string, after uint64) (events.View, error) {
	return f.until(ctx, id, after, "settle", settled)
}

// settled decides a wait for an outcome: a phase that is not transient
// (the terminal ones too) is one.
func settled(view events.View) (bool, error) { return !view.Phase.Transient(), nil }

// until returns the first view of id at a sequence above after that
// decide says is done, with decide's error; what names the wait in an
// error.
func (f *Follower) until(ctx context.Context, id string, after uint64, what string, decide func(events.View) (bool, error)) (events.View, error) {
	if !viewKey(id) {
		return events.View{}, fmt.Errorf("sandbox %q: %w", id, events.ErrNotFound)
	}
	w := &waiter{ch: make(chan events.View, waiterQueue)}
	f.mu.Lock()
	if f.waits[id] == nil {
		f.waits[id] = map[*waiter]struct{}{}
	}
	f.waits[id][w] = struct{}{}
	back := f.back
	// Registered and read under one lock: a change the follower saw
	// before is here, one it sees after comes to w.
	cached, isCached := f.latest[id]
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.waits[id], w)
		if len(f.waits[id]) == 0 {
			delete(f.waits, id)
		}
		f.mu.Unlock()
	}()
	var last events.View
	// Registered first, then read: a change stored after the read comes
	// from the watch, one stored before is in the read.
	read := func() (events.View, bool, error) {
		if isCached {
			isCached = false
			if cached.view != nil {
				return *cached.view, true, nil
			}
			var view events.View
			if err := json.Unmarshal(cached.raw, &view); err == nil {
				return view, true, nil
			}
		}
		view, err := f.v.Get(ctx, id)
		if errors.Is(err, events.ErrNotFound) {
			return view, false, nil
		}
		return view, err == nil, err
	}
	check := func(view events.View) (bool, error) {
		last = view
		if view.Seq <= after {
			return false, nil
		}
		return decide(view)
	}
	for {
		view, ok, err := read()
		if err != nil && ctx.Err() == nil {
			return last, fmt.Errorf("wait for %s: %w", id, err)
		}
		if ok && view.Seq >= last.Seq {
			if done, err := check(view); done {
				return view, err
			}
		}
	changes:
		for {
			select {
			case <-ctx.Done():
				return last, fmt.Errorf("wait for %s to %s (is %q): %w", id, what, last.Phase, ctx.Err())
			case <-back:
				// The watch was lost and is back: read again, for what
				// it missed meanwhile.
				f.mu.Lock()
				back = f.back
				f.mu.Unlock()
				break changes
			case view := <-w.ch:
				if view.Seq < last.Seq {
					continue
				}
				if done, err := check(view); done {
					return view, err
				}
			}
		}
	}
}

// Watch is View.Watch served by the follower: the views of the sandboxes
// changed after seq afterSeq (0: every sandbox), then each change as the
// follower sees it, until ctx ends or the channel is closed. A watch
// resumed with the seq of a change the follower still holds (the last
// ringSize) is replayed from memory; any other starts with the current
// value of every key above afterSeq, read once from the bucket (a watch of
// its initial values, stopped at their end). A watch that falls subQueue
// changes behind, or outlives the follower's own watch, is closed: its
// client resumes with its last seq, and what it missed comes in that
// start. No view of a sandbox is sent at or below a seq already sent for
// it in the same watch.
func (f *Follower) Watch(ctx context.Context, afterSeq uint64) (<-chan events.View, error) {
	select {
	case <-f.up: // before, the follower would end it as it comes up
	case <-ctx.Done():
		return nil, fmt.Errorf("watch %s: the follower is not up: %w", f.v.cfg.Bucket, ctx.Err())
	}
	s := &sub{ch: make(chan change, subQueue)}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	backlog, fromRing := f.since(afterSeq)
	f.mu.Unlock()
	release := func() {
		f.mu.Lock()
		f.end(s)
		f.mu.Unlock()
	}
	out := make(chan events.View, 64)
	go func() {
		defer close(out)
		defer release()
		sent := map[string]uint64{}
		send := func(key string, raw []byte, floor uint64) bool {
			var view events.View
			if json.Unmarshal(raw, &view) != nil || view.Seq <= max(floor, sent[key]) {
				return true // a value this build cannot read is no change to show
			}
			sent[key] = view.Seq
			select {
			case out <- view:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if !fromRing {
			if !f.snapshot(ctx, func(key string, raw []byte) bool { return send(key, raw, afterSeq) }) {
				return
			}
		}
		for _, c := range backlog {
			if !send(c.key, c.raw, 0) {
				return
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case c, ok := <-s.ch:
				if !ok {
					return
				}
				if !send(c.key, c.raw, 0) {
					return
				}
			}
		}
	}()
	return out, nil
}

// A watch's snapshot is pulled snapshotBytes at a time, at most
// snapshotPulls pulls of one follower at once: what the server may have
// sent the service for all its watches and the service not yet read is at
// most their product, far under the server's limit on a connection's
// pending bytes (64 MiB by default), however many watches start at once.
const (
	snapshotBytes = 1 << 20
	snapshotPulls = 16
)

// snapshot hands the current value of every key to send, through a pull
// consumer of its own, and deletes it; false when ctx ended first, send
// refused, or the bucket could not be read (the watch then ends, and its
// client resumes).
//
// Why not KeyValue.WatchAll, as before: each watch was a push consumer on
// the service's one connection, and the server pushed every watch's whole
// snapshot at once, as fast as it could, while the watches drained them
// only as fast as their clients read: the connection's pending bytes grew
// past the server's limit and the server cut it as a slow consumer (30
// watches over 50k sandboxes; TestManyWatchesKeepTheConnection), taking
// the service's commands, appends and heartbeats down with it. Pulled, the
// server sends no more than asked, and each pull is read whole into memory
// before its values go to a (slow) client.
func (f *Follower) snapshot(ctx context.Context, send func(key string, raw []byte) bool) bool {
	stream, err := f.v.js.Stream(ctx, "KV_"+f.v.cfg.Bucket)
	if err != nil {
		return false
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		FilterSubject:     "$KV." + f.v.cfg.Bucket + ".>",
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute, // if the deletion below is lost
	})
	if err != nil {
		return false
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
		cancel()
	}()
	if cons.CachedInfo().NumPending == 0 {
		return true // an empty bucket
	}
	for {
		vals, last, err := f.pull(ctx, cons)
		if err != nil {
			return false
		}
		for _, c := range vals {
			if !send(c.key, c.raw) {
				return false
			}
		}
		if last {
			return true
		}
	}
}

// pull reads one pull of a snapshot whole, as one of snapshotPulls at once:
// its values (deleted keys left out), and whether the last current value
// was among them.
func (f *Follower) pull(ctx context.Context, cons jetstream.Consumer) ([]change, bool, error) {
	select {
	case f.pulls <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	defer func() { <-f.pulls }()
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	batch, err := cons.FetchBytes(f.pullBytes, jetstream.FetchContext(fctx))
	if err != nil {
		return nil, false, err
	}
	prefix := "$KV." + f.v.cfg.Bucket + "."
	var out []change
	for m := range batch.Messages() {
		meta, err := m.Metadata()
		if err != nil {
			return nil, false, err
		}
		key := strings.TrimPrefix(m.Subject(), prefix)
		if m.Headers().Get("KV-Operation") == "" && viewKey(key) {
			out = append(out, change{key: key, raw: m.Data()})
		}
		if meta.NumPending == 0 {
			return out, true, nil // the last current value
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return nil, false, err
	}
	if len(out) == 0 {
		return nil, false, fmt.Errorf("snapshot of %s: a pull brought nothing", f.v.cfg.Bucket)
	}
	return out, false, nil
}

// since returns the changes the follower holds after the one at seq
// afterSeq, and whether it holds that one (else the watch must start from
// the bucket). The caller holds f.mu.
func (f *Follower) since(afterSeq uint64) ([]change, bool) {
	if afterSeq == 0 {
		return nil, false
	}
	n := len(f.ring)
	at := func(i int) change { return f.ring[(f.head+i)%n] } // i-th oldest
	for i := n - 1; i >= 0; i-- {
		var v struct {
			Seq uint64 `json:"seq"`
		}
		if json.Unmarshal(at(i).raw, &v) == nil && v.Seq == afterSeq {
			out := make([]change, 0, n-1-i)
			for j := i + 1; j < n; j++ {
				out = append(out, at(j))
			}
			return out, true
		}
	}
	return nil, false
}
