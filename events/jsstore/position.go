package jsstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// PositionBucket is the KV bucket of followers' positions: follower name →
// the sequence of the last event it handled, in decimal.
const PositionBucket = events.PositionBucket

// Position is a follower's checkpoint, kept in PositionBucket so that it
// outlives the process: the follower passes it to Follow as after when it
// starts again. It is safe for concurrent use.
type Position struct {
	kv   jetstream.KeyValue
	name string
	bad  func(name string, err error)
}

// Position creates the positions bucket, or binds to it when it exists, and
// returns the position of the follower name, a valid KV key (letters,
// digits, - _ / = and dots between tokens).
func (s *Store) Position(ctx context.Context, name string) (*Position, error) {
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      PositionBucket,
		Description: "torpor follower name → last sequence handled",
		History:     1,
		MaxBytes:    events.PositionBucketMaxBytes,
		Replicas:    s.cfg.Replicas,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("position %s: bucket %s: %w", name, PositionBucket, natserr.Unavailable(err))
	}
	p := &Position{kv: kv, name: name, bad: s.cfg.OnBadPosition}
	// One read now, so that a name the KV API refuses fails here.
	if _, err := p.Get(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Get returns the position last Set, 0 before any, and 0 when the key
// holds no sequence (Config.OnBadPosition hears of it).
func (p *Position) Get(ctx context.Context) (uint64, error) {
	e, err := p.kv.Get(ctx, p.name)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("get position %s: %w", p.name, natserr.Unavailable(err))
	}
	seq, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		// Garbage: start from the beginning of the log rather than not at
		// all; the next Set overwrites it.
		if p.bad != nil {
			p.bad(p.name, fmt.Errorf("position %s at revision %d: %w; following from 0", p.name, e.Revision(), err))
		}
		return 0, nil
	}
	return seq, nil
}

// Set stores seq as it is, even below the current position: the follower
// decides where it is (moving back replays events, which it handles
// idempotently anyway).
func (p *Position) Set(ctx context.Context, seq uint64) error {
	if _, err := p.kv.Put(ctx, p.name, strconv.AppendUint(nil, seq, 10)); err != nil {
		return fmt.Errorf("set position %s to %d: %w", p.name, seq, natserr.Unavailable(err))
	}
	return nil
}
