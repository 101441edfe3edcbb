package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// leaderReads is the JetStream of a node whose streams have replicas: every
// KV bucket it makes or binds is read through its stream leader, not with
// direct gets. A direct get is answered by any replica, and the server lets
// a replica answer once it is 90% caught up (nats-server, monitorStream): a
// replica whose server just came back answers with values the bucket has
// long replaced. For the phase view that is a view going back in time (a
// sandbox ready again after it was suspended, which a wait takes for the
// ready it waits for); for the names, a name not found or found on a
// deleted sandbox. Reads through the leader cost the leader the reads; the
// log itself keeps its direct gets, which jsstore checks against the
// leader's head (jsstore.Store.Load).
type leaderReads struct {
	jetstream.JetStream
}

// consistent is js, with buckets read through their leaders when replicas
// is above 1.
func consistent(js jetstream.JetStream, replicas int) jetstream.JetStream {
	if replicas < 2 {
		return js
	}
	return leaderReads{js}
}

func (l leaderReads) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if _, err := l.JetStream.CreateKeyValue(ctx, cfg); err != nil {
		return nil, err
	}
	return l.KeyValue(ctx, cfg.Bucket)
}

func (l leaderReads) CreateOrUpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if _, err := l.JetStream.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		return nil, err
	}
	return l.KeyValue(ctx, cfg.Bucket)
}

func (l leaderReads) UpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if _, err := l.JetStream.UpdateKeyValue(ctx, cfg); err != nil {
		return nil, err
	}
	return l.KeyValue(ctx, cfg.Bucket)
}

// KeyValue binds bucket after turning its direct gets off (the KV handle
// reads its stream's AllowDirect once, when bound).
func (l leaderReads) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	s, err := l.JetStream.Stream(ctx, "KV_"+bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, jetstream.ErrBucketNotFound
		}
		return nil, err
	}
	if cfg := s.CachedInfo().Config; cfg.AllowDirect {
		cfg.AllowDirect = false
		if _, err := l.JetStream.UpdateStream(ctx, cfg); err != nil {
			return nil, fmt.Errorf("bucket %s: reads through the leader: %w", bucket, err)
		}
		// The update goes through the stream's raft group: until it has
		// a leader again, reads of the bucket find no one to answer. (A
		// leader, not every peer current: one server of three may be
		// down.)
		if err := settled(ctx, s, 1); err != nil {
			return nil, fmt.Errorf("bucket %s: reads through the leader: %w", bucket, err)
		}
	}
	return l.JetStream.KeyValue(ctx, bucket)
}
