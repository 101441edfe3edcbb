package kvview

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// Follower serves the waits of one process from one watch of the bucket:
// every view change is read once and handed to the waits of its sandbox,
// so that a wait costs no consumer on the server (View.Wait makes one per
// call). Make one with View.Follow.
type Follower struct {
	v *View

	mu    sync.Mutex
	waits map[string]map[*waiter]struct{} // by sandbox id
	// back is closed, and replaced, each time the watch (again) delivers
	// changes: a wait then reads its view afresh, for what it missed.
	back chan struct{}
}

// waiter is one wait's queue of the views of its sandbox, newest last.
type waiter struct {
	ch chan events.View
}

// waiterQueue is how many changes of its sandbox one wait holds before it
// reads them; an overflow drops the oldest (the newest is what a wait
// decides on, and each view holds the whole state of its sandbox).
const waiterQueue = 16

// followRetry is the wait before the follower watches the bucket again
// after its watch ended.
const followRetry = 250 * time.Millisecond

// Follow starts the follower of v's bucket, which runs until ctx ends.
func (v *View) Follow(ctx context.Context) *Follower {
	f := &Follower{v: v, waits: map[string]map[*waiter]struct{}{}, back: make(chan struct{})}
	go f.run(ctx)
	return f
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
			f.mu.Unlock()
			f.follow(ctx, w)
			stop(w)
		}
		select {
		case <-ctx.Done():
		case <-time.After(followRetry):
		}
	}
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
			f.mu.Lock()
			waiting := len(f.waits[e.Key()])
			f.mu.Unlock()
			if waiting == 0 {
				continue // nobody waits: not even decoded
			}
			view, err := decode(e)
			if err != nil {
				continue
			}
			f.mu.Lock()
			for w := range f.waits[e.Key()] {
				w.put(view)
			}
			f.mu.Unlock()
		}
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
		view, err := f.v.Get(ctx, id)
		if errors.Is(err, events.ErrNotFound) {
			return view, false, nil
		}
		return view, err == nil, err
	}
	decide := func(view events.View) (bool, error) {
		last = view
		switch {
		case view.Seq <= after:
			return false, nil
		case view.Phase == phase:
			return true, nil
		case view.Phase.Terminal():
			return true, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s; it will never be %s", id, view.Phase, phase)
		}
		return false, nil
	}
	for {
		view, ok, err := read()
		if err != nil && ctx.Err() == nil {
			return last, fmt.Errorf("wait for %s: %w", id, err)
		}
		if ok && view.Seq >= last.Seq {
			if done, err := decide(view); done {
				return view, err
			}
		}
	changes:
		for {
			select {
			case <-ctx.Done():
				return last, fmt.Errorf("wait for %s to be %s (is %q): %w", id, phase, last.Phase, ctx.Err())
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
				if done, err := decide(view); done {
					return view, err
				}
			}
		}
	}
}
