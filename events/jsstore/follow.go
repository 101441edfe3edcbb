package jsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// minFollowPull is the fewest messages a follower's consumer asks for per
// pull, so that small batches still keep the pipe full.
const minFollowPull = 512

// delivery is one result of the consumer's iterator.
type delivery struct {
	msg jetstream.Msg
	err error
}

// Follow runs an ordered consumer from after+1 over every sandbox's subject
// and hands h the events in stream order, up to max at a time: whatever has
// arrived when h is free, never waiting to fill a batch. pending is the
// server's count of the messages after the batch's last one when it sent
// that one. An ordered consumer keeps no state worth keeping on the server
// and takes no acknowledgements; when it misses a heartbeat or a message it
// recreates itself after the last message it saw.
//
// Follow returns nil when ctx ends, also when h fails because it did, and
// h's error otherwise. A foreign message (not a torpor event, see
// events.Vet) is left out of its batch.
func (s *Store) Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error {
	if max < 1 {
		return fmt.Errorf("follow: batch size %d: want 1 or more", max)
	}
	pull := 2 * max
	if pull < minFollowPull {
		pull = minFollowPull
	}
	it, err := s.messages(ctx, after+1, jetstream.PullMaxMessages(pull), jetstream.PullHeartbeat(FollowHeartbeat))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("follow after %d: %w", after, err)
	}

	// The pump moves messages from the iterator into a channel, so that the
	// loop below can take what has arrived without blocking: the iterator
	// itself has no "is anything buffered" call.
	pctx, stopPump := context.WithCancel(ctx)
	ch := make(chan delivery, max)
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		for {
			msg, err := it.Next(jetstream.NextContext(pctx))
			if errors.Is(err, jetstream.ErrNoHeartbeat) && pctx.Err() == nil {
				// Its server went silent for two beats at least (died, or
				// cut off). The ordered consumer would recreate itself,
				// but with nats.go's backoff (1 s doubling to 10 s, each
				// try waiting up to 10 s while the stream elects a
				// leader): the view and the sagas stood still for more
				// than 30 s after a server was killed. The reading ends
				// instead, and the caller follows again from where it is,
				// at its own pace.
				now := time.Now()
				s.out.mark(now.Add(-2*FollowHeartbeat), now)
				err = fmt.Errorf("%w: %w", events.ErrUnavailable, err)
			}
			select {
			case ch <- delivery{msg, err}:
			case <-pctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		stopPump()
		it.Stop() // also ends a recreation in progress
		<-pumped
	}()

	envs := make([]events.Envelope, 0, max)
	for {
		var d delivery
		select {
		case <-ctx.Done():
			return nil
		case d = <-ch:
		}
		envs = envs[:0]
		var pending uint64
		var failed error
	take:
		for n := 0; ; {
			if d.err != nil {
				failed = d.err
				break
			}
			if env, meta, err := s.decodeMsg(d.msg); err == nil {
				envs = append(envs, env)
				pending = meta.NumPending
			} else if meta != nil {
				pending = meta.NumPending
			}
			if n++; n == max {
				break
			}
			select {
			case d = <-ch:
			default:
				break take
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if len(envs) > 0 {
			if err := h(ctx, envs, pending); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		if failed != nil {
			return fmt.Errorf("follow: %w", natserr.Unavailable(failed))
		}
	}
}

// FollowHeartbeat is how often the server beats on a follower's idle
// consumer. An ordered consumer whose server died (a NATS server of the
// cluster, not the one this connection is on) is found missing only by
// its beats: two missed, and it recreates itself on a server that is up.
// nats.go's default of 5 s left the sagas and the view ten seconds behind,
// long enough for a deadline to pass on a resume that had already
// succeeded.
const FollowHeartbeat = time.Second

// messages starts an ordered consumer at sequence start over every
// sandbox's subject and returns its iterator.
func (s *Store) messages(ctx context.Context, start uint64, pull ...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	cons, err := s.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{SubjectPrefix + ">"},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    start,
		// One try to make (or remake) the consumer: a failure comes back
		// to the caller, which follows again at its own pace, rather
		// than nats.go retrying for ever with a backoff up to 10 s.
		MaxResetAttempts: 1,
	})
	if err != nil {
		return nil, natserr.Unavailable(err)
	}
	it, err := cons.Messages(pull...)
	if err != nil {
		return nil, natserr.Unavailable(err)
	}
	return it, nil
}

// decodeMsg turns a delivered message into its envelope, with Seq and MsgID
// set, and also returns its metadata (nil when it has none). A foreign
// message is counted and reported (see Foreign) and comes back as an error.
func (s *Store) decodeMsg(msg jetstream.Msg) (events.Envelope, *jetstream.MsgMetadata, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return events.Envelope{}, nil, fmt.Errorf("metadata of %s: %w", msg.Subject(), err)
	}
	env, err := s.envelope(meta.Sequence.Stream, msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		return env, meta, fmt.Errorf("%s at %d: %w", msg.Subject(), meta.Sequence.Stream, err)
	}
	return env, meta, nil
}
