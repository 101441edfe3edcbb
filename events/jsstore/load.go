package jsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
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
// may be answered by a replica that lags the leader (by a few messages, or
// by minutes when its server just came back): Load reads up to the head the
// leader gives (Head), so that it never returns less than the log held when
// it was called, and a sandbox that exists is never NOT_FOUND.
func (s *Store) Load(ctx context.Context, id string, after uint64) (_ []events.Envelope, err error) {
	op := s.out.begin(time.Now())
	defer func() { s.out.end(op, time.Now(), errors.Is(err, events.ErrUnavailable)) }()
	out := []events.Envelope{}
	// head, on a replicated stream or after a sequence, is the subject's
	// last sequence (the leader's word on a replicated stream): most loads
	// after a sequence find nothing (a saga checking that nothing followed
	// its intent), and one get of the subject's last message answers that
	// for a fraction of a batched get.
	var head uint64
	known := after > 0 || s.cfg.Replicas > 1
	if known {
		if head, err = s.Head(ctx, id); err != nil {
			return nil, fmt.Errorf("load %s after %d: %w", id, after, err)
		}
		if head <= after {
			return out, nil
		}
	}
	next, seen := after+1, after
	for lagged := 0; ; {
		more, last, err := s.loadBatch(ctx, id, next, &out)
		if err != nil {
			return nil, fmt.Errorf("load %s after %d: %w", id, after, err)
		}
		seen = max(seen, last)
		if more {
			next = last + 1
			continue
		}
		if !known || seen >= head || s.cfg.Replicas < 2 {
			return out, nil
		}
		// The batched get is a direct get, which any replica answers: one
		// that lags the leader (a server restarted, catching up) left out
		// the newest events. Read on from where it stopped, in a moment.
		if lagged++; lagged > lagRetries {
			return nil, fmt.Errorf("load %s: %w: the replicas lag the leader at %d", id, events.ErrUnavailable, head)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("load %s: %w: %w", id, events.ErrUnavailable, ctx.Err())
		case <-time.After(lagBackoff):
		}
		next = seen + 1
	}
}

// lagRetries and lagBackoff bound the reads of a subject that the leader
// says has more messages than the replica that answered had.
const (
	lagRetries = 100
	lagBackoff = 20 * time.Millisecond
)

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
		return false, 0, natserr.Unavailable(err)
	}
	n, pending := 0, ""
	for msg, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) && n == 0 {
			return false, 0, nil
		}
		if err != nil {
			return false, 0, natserr.Unavailable(err)
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
//
// On a replicated stream it is the leader's word (the STREAM.MSG.GET API),
// not a direct get that a replica lagging the leader may answer: a state
// folded up to it decides as the log stands now.
func (s *Store) Head(ctx context.Context, id string) (uint64, error) {
	if s.cfg.Replicas > 1 {
		seq, _, err := s.lastOf(ctx, Subject(id))
		if err != nil {
			return 0, fmt.Errorf("head of %s: %w", id, natserr.Unavailable(err))
		}
		return seq, nil
	}
	last, err := s.stream.GetLastMsgForSubject(ctx, Subject(id))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("head of %s: %w", id, natserr.Unavailable(err))
	}
	return last.Sequence, nil
}
