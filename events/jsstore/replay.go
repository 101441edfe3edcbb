package jsstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// ReplayChunk is how many envelopes Replay hands over at a time.
const ReplayChunk = 1000

// replayPull is how many messages the ordered consumer asks for per pull:
// large enough to keep the pipe full while the chunks are handled.
const replayPull = 4096

// Replay reads the whole log from sequence from (0 and 1 both mean the
// start) up to its last sequence at the call, in order, with an ordered
// consumer (no durable state on the server, no acknowledgements), and hands
// the decoded envelopes to h in chunks of up to ReplayChunk. h may keep the
// envelopes but not the slice, which is reused. It returns the last
// sequence of the log at the call: every event from from up to it was
// handed to h. An error of h stops the replay and is returned.
//
// Replay is how a view is rebuilt from nothing: it stops at the head, where
// Follow goes on with the events appended later.
func (s *Store) Replay(ctx context.Context, from uint64, h func([]events.Envelope) error) (uint64, error) {
	last, err := s.LastSeq(ctx)
	if err != nil {
		return 0, fmt.Errorf("replay: %w", err)
	}
	from = max(from, 1)
	if last < from {
		return last, nil
	}
	err = s.replay(ctx, from, last, h)
	if err != nil {
		return 0, fmt.Errorf("replay from %d to %d: %w", from, last, err)
	}
	return last, nil
}

// replay runs an ordered consumer from from to last and hands the decoded
// envelopes to h in chunks.
func (s *Store) replay(ctx context.Context, from, last uint64, h func([]events.Envelope) error) error {
	it, err := s.messages(ctx, from, jetstream.PullMaxMessages(replayPull))
	if err != nil {
		return err
	}
	defer it.Stop()
	chunk := make([]events.Envelope, 0, ReplayChunk)
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			continue // the ordered consumer recreates itself
		case err != nil:
			return natserr.Unavailable(err)
		}
		env, meta, err := s.decodeMsg(msg)
		if meta == nil {
			return err
		}
		seq := meta.Sequence.Stream
		if err == nil {
			chunk = append(chunk, env)
		}
		if len(chunk) == ReplayChunk || (seq >= last && len(chunk) > 0) {
			if err := h(chunk); err != nil {
				return err
			}
			chunk = chunk[:0]
		}
		if seq >= last {
			return nil
		}
	}
}
