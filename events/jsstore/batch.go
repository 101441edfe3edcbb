package jsstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

var _ events.BatchSubscriber = (*Store)(nil)

// delivery is one result of the consumer's iterator.
type delivery struct {
	msg jetstream.Msg
	err error
}

// SubscribeBatch is Subscribe handing h up to max events at a time: the
// events that have already arrived when h is free, never waiting for more
// to fill a batch. It runs the same durable consumer as Subscribe (same
// name, same config), so a subscriber may move from one to the other and
// resume where the other stopped.
//
// Every event of a batch is acknowledged when h returns nil; when h fails,
// every one is handed back (Nak) to come again after Config.NakDelay, while
// later events go on, exactly as with Subscribe. While h runs, the whole
// batch is kept in progress. An envelope that is not JSON is terminated and
// left out of its batch.
func (s *Store) SubscribeBatch(ctx context.Context, name string, max int, h events.BatchHandler) error {
	if max < 1 {
		return fmt.Errorf("subscribe %s: batch size %d: want 1 or more", name, max)
	}
	it, err := s.messages(ctx, name)
	if err != nil || it == nil {
		return err
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
				continue // the iterator issues a new pull by itself
			}
			select {
			case ch <- delivery{msg, err}:
			case <-pctx.Done():
				if msg != nil {
					_ = msg.Nak()
				}
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		stopPump()
		<-pumped
		for {
			select {
			case d := <-ch:
				if d.msg != nil {
					_ = d.msg.Nak()
				}
			default:
				handBack(it)
				return
			}
		}
	}()

	msgs := make([]jetstream.Msg, 0, max)
	envs := make([]events.Envelope, 0, max)
	for {
		var d delivery
		select {
		case <-ctx.Done():
			return nil
		case d = <-ch:
		}
		msgs, envs = msgs[:0], envs[:0]
		var failed error
	take:
		for {
			if d.err != nil {
				failed = d.err
				break
			}
			msgs = append(msgs, d.msg)
			if len(msgs) == max {
				break
			}
			select {
			case d = <-ch:
			default:
				break take
			}
		}
		if failed != nil {
			nakAll(msgs, 0)
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("subscribe %s: %w", name, unavailable(failed))
		}

		good := msgs[:0]
		for _, msg := range msgs {
			env, err := decodeMsg(msg)
			if err != nil {
				_ = msg.TermWithReason(err.Error())
				continue
			}
			good = append(good, msg)
			envs = append(envs, env)
		}
		msgs = good
		if len(msgs) == 0 {
			continue
		}
		if err := s.handleBatch(ctx, msgs, envs, h); err != nil {
			if ctx.Err() != nil {
				nakAll(msgs, 0)
				return nil
			}
			nakAll(msgs, s.cfg.NakDelay)
			continue
		}
		for _, msg := range msgs {
			_ = msg.Ack()
		}
	}
}

// nakAll hands msgs back to come again after delay.
func nakAll(msgs []jetstream.Msg, delay time.Duration) {
	for _, msg := range msgs {
		if delay > 0 {
			_ = msg.NakWithDelay(delay)
		} else {
			_ = msg.Nak()
		}
	}
}

// handleBatch runs h on envs, telling the server every third of the ack wait
// that every message of the batch is still in progress.
func (s *Store) handleBatch(ctx context.Context, msgs []jetstream.Msg, envs []events.Envelope, h events.BatchHandler) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(s.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				for _, msg := range msgs {
					_ = msg.InProgress()
				}
			case <-done:
				return
			}
		}
	})
	err := h(ctx, envs)
	close(done)
	wg.Wait() // msgs is reused for the next batch
	return err
}
