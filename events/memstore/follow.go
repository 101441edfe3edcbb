package memstore

import (
	"context"
	"fmt"

	"github.com/torpor/torpor/events"
)

// Follow hands h every event above after, in order, up to max at a time:
// whatever the log holds when h is free. At the head it waits for the next
// append. It returns nil when ctx ends, also when h fails because it did,
// and h's error otherwise. The store keeps nothing for the follower.
func (s *Store) Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error {
	if max < 1 {
		return fmt.Errorf("follow: batch size %d: want 1 or more", max)
	}
	batch := make([]events.Envelope, 0, max)
	for {
		var pending, scanned uint64
		var changed <-chan struct{}
		batch, scanned, pending, changed = s.batch(batch[:0], after, max)
		if len(batch) == 0 && scanned > after {
			after = scanned // only foreign events: nothing to hand over
			continue
		}
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
				continue
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err := h(ctx, batch, pending); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		after = batch[len(batch)-1].Seq
	}
}

// batch appends to out up to max events above after, leaving out foreign
// ones, and returns it with the last sequence it looked at and how many
// events follow; when there are none, changed is closed by the next append.
func (s *Store) batch(out []events.Envelope, after uint64, max int) (_ []events.Envelope, scanned, pending uint64, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	head := uint64(len(s.log))
	scanned = after
	for seq := after + 1; seq <= head && len(out) < max; seq++ {
		scanned = seq
		if env := s.log[seq-1]; events.Vet(env, env.SandboxID, env.Type) != nil {
			continue
		}
		out = append(out, s.event(seq))
	}
	if scanned == after {
		return out, scanned, 0, s.changed
	}
	return out, scanned, head - scanned, nil
}
