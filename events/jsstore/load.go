package jsstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/torpor/torpor/events"
)

// loadBatch is how many messages one batched direct get asks for.
const loadBatch = 1000

// SyncQueueLen is the sync queue length (nats.SyncQueueLen) that a
// connection used by a Store should have. A batched direct get (orbit's
// GetBatch) subscribes with the connection's sync queue; nats.go's default of
// 65536 slots is half a megabyte of garbage per Load. The queue must hold a
// whole batch (loadBatch messages and the end marker): a fuller queue drops
// messages, and a batch missing some in the middle would look complete.
const SyncQueueLen = 4 * loadBatch

// headerNumPending is set by the server on each message of a batched direct
// get: how many messages of the filter follow it.
const headerNumPending = "Nats-Num-Pending"

// Load returns the events of sandbox id above after, with batched direct
// gets filtered on the sandbox's subject, so it costs in the events of that
// sandbox, not in the length of the log. On a replicated stream a direct get
// may be answered by a replica that lags the leader by a few messages; an
// append on such a stale load fails with events.ErrConflict and the reload
// catches up.
func (s *Store) Load(ctx context.Context, id string, after uint64) ([]events.Envelope, error) {
	out := []events.Envelope{}
	if after > 0 {
		// Most loads after a sequence find nothing (a saga checking that
		// nothing followed its intent): one direct get of the subject's last
		// message answers that for a fraction of a batched get.
		head, err := s.Head(ctx, id)
		switch {
		case err != nil:
			return nil, fmt.Errorf("load %s after %d: %w", id, after, err)
		case head <= after:
			return out, nil
		}
	}
	next := after + 1
	for {
		more, last, err := s.loadBatch(ctx, id, next, &out)
		if err != nil {
			return nil, fmt.Errorf("load %s after %d: %w", id, after, err)
		}
		if !more {
			return out, nil
		}
		next = last + 1
	}
}

// loadBatch appends to out the events of id from sequence from on, one
// batch, leaving out foreign messages, and says whether more follow and the
// last sequence it read.
//
// A batched get ends silently when its answer times out, so completeness is
// read from the server's own counts: the last message of a complete read
// says that no message is pending after it, and an empty subject answers
// "no messages". An answer that says neither did not come back whole.
func (s *Store) loadBatch(ctx context.Context, id string, from uint64, out *[]events.Envelope) (more bool, last uint64, err error) {
	msgs, err := jetstreamext.GetBatch(ctx, s.js, s.cfg.Stream, loadBatch,
		jetstreamext.GetBatchSubject(Subject(id)), jetstreamext.GetBatchSeq(from))
	if err != nil {
		return false, 0, unavailable(err)
	}
	n, pending := 0, ""
	for msg, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) && n == 0 {
			return false, 0, nil
		}
		if err != nil {
			return false, 0, unavailable(err)
		}
		last = msg.Sequence
		n++
		pending = msg.Header.Get(headerNumPending)
		if env, err := s.envelope(msg.Sequence, msg.Subject, msg.Header, msg.Data); err == nil {
			*out = append(*out, env)
		}
	}
	switch {
	case n > 0 && pending == "0":
		return false, last, nil
	case n > 0:
		return true, last, nil // the batch filled up, or the answer broke off: ask again from here
	case ctx.Err() != nil:
		return false, 0, fmt.Errorf("%w: %w", events.ErrUnavailable, ctx.Err())
	default:
		return false, 0, fmt.Errorf("%w: batched get of %s from %d: no answer", events.ErrUnavailable, Subject(id), from)
	}
}

// Head is the sequence of the last message on sandbox id's subject, 0 when
// it has none, whether or not that message is a torpor event: an append
// that expects it lands after whatever Load left out.
func (s *Store) Head(ctx context.Context, id string) (uint64, error) {
	last, err := s.stream.GetLastMsgForSubject(ctx, Subject(id))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("head of %s: %w", id, unavailable(err))
	}
	return last.Sequence, nil
}
