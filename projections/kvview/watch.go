package kvview

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// Wait returns the view of sandbox id as soon as its phase is phase, at a
// sequence above after (0: any): a client that just sent a command passes
// the sequence the command answered with, so that a view from before the
// command, in the phase it waits for, does not answer it. A view
// in a terminal phase other than phase comes back with a FAILED_PRECONDITION
// error: it will never get there. An id the bucket does not hold yet may not
// be projected yet, so Wait keeps waiting for it. When ctx ends, Wait returns
// the last view it saw (zero if none) and an error wrapping ctx.Err(), which
// is context.DeadlineExceeded at a timeout.
func (v *View) Wait(ctx context.Context, id string, phase events.Phase, after uint64) (events.View, error) {
	return v.until(ctx, id, after, "be "+string(phase), func(view events.View) (bool, error) {
		switch {
		case view.Phase == phase:
			return true, nil
		case view.Phase.Terminal():
			return true, events.Errorf(events.CodeFailedPrecondition,
				"sandbox %s is %s; it will never be %s", id, view.Phase, phase)
		}
		return false, nil
	})
}

// Settle returns the first view of sandbox id at a sequence above after
// whose phase is not transient (CONTRACT §1): the outcome of a command
// that answered the view at after+1, whatever it is (suspended, or ready
// again when the driver rejected the suspension, or error). An id the
// bucket does not hold yet is waited for; when ctx ends, Settle returns the
// last view it saw with an error wrapping ctx.Err().
func (v *View) Settle(ctx context.Context, id string, after uint64) (events.View, error) {
	return v.until(ctx, id, after, "settle", settled)
}

// until returns the first view of id at a sequence above after that
// decide says is done, with decide's error; what names the wait in an
// error.
func (v *View) until(ctx context.Context, id string, after uint64, what string, decide func(events.View) (bool, error)) (events.View, error) {
	if !viewKey(id) {
		return events.View{}, fmt.Errorf("sandbox %q: %w", id, events.ErrNotFound)
	}
	// The watch delivers the current value first, then every change: no
	// change between a read and a watch can be missed.
	w, err := v.kv.Watch(ctx, id, jetstream.IgnoreDeletes())
	if err != nil {
		return events.View{}, fmt.Errorf("wait for %s: watch: %w", id, natserr.Unavailable(err))
	}
	defer stop(w)
	var last events.View
	for {
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("wait for %s to %s (is %q): %w", id, what, last.Phase, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				// Its consumer went with a NATS server: the wait may be
				// asked again (UNAVAILABLE), not failed (INTERNAL).
				return last, fmt.Errorf("wait for %s: watch closed: %w", id, events.ErrUnavailable)
			}
			if e == nil {
				continue // end of current values; the rest are changes
			}
			view, err := decode(e)
			if err != nil {
				v.garbage.Add(1)
				continue // not a view: its next write is one
			}
			last = view
			if view.Seq <= after {
				continue // from before what the caller waits on
			}
			if done, err := decide(view); done {
				return view, err
			}
		}
	}
}

// Watch streams every view change: first the current view of every sandbox,
// then each change as it is stored, leaving out views whose seq is at or
// below afterSeq (a resume after the last seq a client saw). The channel is
// closed when ctx ends. It is a Follower's watch on a follower of its own,
// which ends with ctx: a process that watches more than once follows the
// view once (View.Follow) and watches that.
func (v *View) Watch(ctx context.Context, afterSeq uint64) (<-chan events.View, error) {
	return v.Follow(ctx).Watch(ctx, afterSeq)
}
