package jsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// maxAckPending bounds the events handed out to a subscriber and not yet
// acknowledged; they are handled one at a time, the window only keeps the
// pipe full.
const maxAckPending = 10000

// drainWait bounds how long a stopping subscriber waits for the events
// already buffered, to hand them back.
const drainWait = time.Second

// Subscribe runs the durable pull consumer name over every sandbox's subject
// and calls h with each event, one at a time, in stream order, until ctx ends;
// it then returns nil. The consumer is created on first use and delivers the
// whole log; later it resumes after the last acknowledged event.
//
// An event is acknowledged when h returns nil. When h fails, the event is
// handed back (Nak) to come again after Config.NakDelay while later events
// go on: order then holds only per redelivery, so h must tolerate an event
// arriving after its successors (compare Seq). Delivery is at least once: an
// acknowledgement lost in a crash delivers the event again, so h must be
// idempotent. h runs sequentially; a caller that wants parallelism
// dispatches per sandbox itself. Events still buffered when ctx ends are
// handed back for the next subscriber. An envelope that is not JSON cannot
// be handled and is terminated (never delivered again).
func (s *Store) Subscribe(ctx context.Context, name string, h events.Handler) error {
	it, err := s.messages(ctx, name)
	if err != nil || it == nil {
		return err
	}
	defer handBack(it)

	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		switch {
		case ctx.Err() != nil:
			if msg != nil {
				_ = msg.Nak()
			}
			return nil
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			continue // the iterator issues a new pull by itself
		case err != nil:
			return fmt.Errorf("subscribe %s: %w", name, unavailable(err))
		}
		env, err := decodeMsg(msg)
		if err != nil {
			_ = msg.TermWithReason(err.Error())
			continue
		}
		if err := s.handle(ctx, msg, env, h); err != nil {
			if ctx.Err() != nil {
				_ = msg.Nak()
				return nil
			}
			_ = msg.NakWithDelay(s.cfg.NakDelay)
			continue
		}
		_ = msg.Ack()
	}
}

// messages creates or updates the durable consumer name and returns an
// iterator over it; nil and no error when ctx ended first. Subscribe and
// SubscribeBatch share the consumer's config, so one name may move between
// them.
func (s *Store) messages(ctx context.Context, name string) (jetstream.MessagesContext, error) {
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "torpor subscriber " + name,
		FilterSubject: SubjectPrefix + ">",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: maxAckPending,
		AckWait:       s.cfg.AckWait,
	}
	// A consumer that exists keeps where it starts (an operator may have
	// created it past a settled history); the server refuses to change that.
	if c, err := s.js.Consumer(ctx, s.cfg.Stream, name); err == nil {
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = c.CachedInfo().Config.DeliverPolicy, c.CachedInfo().Config.OptStartSeq, c.CachedInfo().Config.OptStartTime
	}
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.cfg.Stream, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, fmt.Errorf("subscribe %s: %w", name, unavailable(err))
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", name, unavailable(err))
	}
	return it, nil
}

// handBack stops it and hands every buffered event back to the server, so
// the next subscriber of the same name gets them now rather than after the
// consumer's ack wait.
func handBack(it jetstream.MessagesContext) {
	it.Drain()
	for {
		msg, err := it.Next(jetstream.NextMaxWait(drainWait))
		if err != nil {
			return
		}
		_ = msg.Nak()
	}
}

// decodeMsg turns a delivered message into its envelope, with Seq and MsgID
// set.
func decodeMsg(msg jetstream.Msg) (events.Envelope, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return events.Envelope{}, fmt.Errorf("metadata of %s: %w", msg.Subject(), err)
	}
	env, err := events.DecodeEnvelope(msg.Data())
	if err != nil {
		return env, fmt.Errorf("decode %s at %d: %w", msg.Subject(), meta.Sequence.Stream, err)
	}
	env.Seq = meta.Sequence.Stream
	env.MsgID = msg.Headers().Get(jetstream.MsgIDHeader)
	return env, nil
}

// handle runs h on env, telling the server every third of the ack wait that
// the event is still in progress.
func (s *Store) handle(ctx context.Context, msg jetstream.Msg, env events.Envelope, h events.Handler) error {
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(s.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = msg.InProgress()
			case <-done:
				return
			}
		}
	}()
	return h(ctx, env)
}
