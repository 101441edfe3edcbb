package jsstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events/natserr"
)

// TimerBucket is the KV bucket of the sagas' long timers (sagas.Timers):
// <runner>.<key> → "armed", one key per ttl, retention or idle timer a
// runner has armed, so that its position may pass the event that armed it.
const TimerBucket = "torpor_timers"

// timerBucketMaxBytes bounds the timers bucket: a key of about 60 bytes per
// sandbox with a ttl, a retained state or an idle policy.
const timerBucketMaxBytes = 256 << 20

// Timers is one runner's keys in TimerBucket (sagas.Timers). It is safe for
// concurrent use.
type Timers struct {
	kv     jetstream.KeyValue
	prefix string
}

// Timers creates the timers bucket, or binds to it when it exists, and
// returns the keys of runner name (a valid KV key: sagas.PositionKey).
func (s *Store) Timers(ctx context.Context, name string) (*Timers, error) {
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      TimerBucket,
		Description: "torpor sagas runner.sandbox.kind → a long timer armed",
		History:     1,
		MaxBytes:    timerBucketMaxBytes,
		Replicas:    s.cfg.Replicas,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("timers %s: bucket %s: %w", name, TimerBucket, natserr.Unavailable(err))
	}
	return &Timers{kv: kv, prefix: name + "."}, nil
}

// List returns every key kept, without the runner's prefix.
func (t *Timers) List(ctx context.Context) ([]string, error) {
	kl, err := t.kv.ListKeysFiltered(ctx, t.prefix+">")
	if err != nil {
		return nil, fmt.Errorf("list timers %s: %w", t.prefix, natserr.Unavailable(err))
	}
	defer func() { _ = kl.Stop() }()
	var keys []string
	for k := range kl.Keys() {
		keys = append(keys, strings.TrimPrefix(k, t.prefix))
	}
	if err := ctx.Err(); err != nil {
		return nil, err // the listing was cut short
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil // a key written during the listing may come twice
}

// Put keeps key.
func (t *Timers) Put(ctx context.Context, key string) error {
	if _, err := t.kv.PutString(ctx, t.prefix+key, "armed"); err != nil {
		return fmt.Errorf("put timer %s%s: %w", t.prefix, key, natserr.Unavailable(err))
	}
	return nil
}

// Delete forgets key; one not kept is no error.
func (t *Timers) Delete(ctx context.Context, key string) error {
	err := t.kv.Delete(ctx, t.prefix+key)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("delete timer %s%s: %w", t.prefix, key, natserr.Unavailable(err))
	}
	return nil
}
