package kvview

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// DefaultPastTTL is how long a view rebuilt for the past (<bucket>_at_<seq>)
// is kept for audit before Reap removes it (serve --replay-ttl).
const DefaultPastTTL = 24 * time.Hour

// rebuildLeftover is the age past which a <bucket>_rebuild_<n> is taken for
// what a crash mid-rebuild left: a rebuild that fails drops its own bucket,
// and one that succeeds deletes it after the swap, within seconds.
const rebuildLeftover = time.Hour

// Reap deletes the buckets rebuilds of bucket left behind, with their
// checkpoints: the views of the past created more than ttl before now, and
// rebuild buckets older than an hour. Each bucket reserves its MaxBytes on
// the server, so without it a replay in a loop would hold storage for ever.
// Their values expire after ttl already (Config.TTL); Reap removes the
// buckets themselves. It returns the buckets deleted.
func Reap(ctx context.Context, js jetstream.JetStream, bucket string, ttl time.Duration, now time.Time) ([]string, error) {
	if bucket == "" {
		bucket = Config{}.withDefaults().Bucket
	}
	names := js.KeyValueStoreNames(ctx)
	var stale []string
	for name := range names.Name() {
		var age time.Duration
		switch {
		case strings.HasPrefix(name, bucket+"_at_"):
			age = ttl
		case strings.HasPrefix(name, bucket+"_rebuild_"):
			age = rebuildLeftover
		default:
			continue
		}
		s, err := js.Stream(ctx, "KV_"+name)
		if err != nil {
			continue // deleted meanwhile
		}
		if now.Sub(s.CachedInfo().Created) > age {
			stale = append(stale, name)
		}
	}
	if err := names.Error(); err != nil {
		return nil, fmt.Errorf("reap %s: list buckets: %w", bucket, err)
	}
	pos, err := js.KeyValue(ctx, events.PositionBucket)
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("reap %s: %w", bucket, err)
	}
	var deleted []string
	for _, name := range stale {
		if err := js.DeleteKeyValue(ctx, name); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return deleted, fmt.Errorf("reap %s: %w", name, err)
		}
		if pos != nil {
			_ = pos.Delete(ctx, checkpointKey(name))
		}
		deleted = append(deleted, name)
	}
	return deleted, nil
}
