package forward

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Entry is where one forward is bound, kept so that a restarted service
// binds it again.
type Entry struct {
	Sandbox string `json:"sandbox"`
	Address string `json:"address"`
	Port    int    `json:"port"`
}

// Index keeps the forwards a service serves, by forward id, beside the log
// (which says which are open): a restart binds those the log still has
// open, without reading the whole log or every view.
type Index interface {
	Put(ctx context.Context, fid string, e Entry) error
	Delete(ctx context.Context, fid string) error
	All(ctx context.Context) (map[string]Entry, error)
}

// IndexBucket is the KV bucket of KVIndex.
const IndexBucket = "torpor_forwards"

// KVIndex is an Index in the KV bucket torpor_forwards.
type KVIndex struct{ kv jetstream.KeyValue }

var _ Index = (*KVIndex)(nil)

// NewKVIndex creates or binds the bucket.
func NewKVIndex(ctx context.Context, js jetstream.JetStream, replicas int) (*KVIndex, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: IndexBucket, Description: "torpor forward id → where it is bound", History: 1, Replicas: max(replicas, 1),
		MaxBytes: 16 << 20, MaxValueSize: 4 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("forwards bucket: %w", err)
	}
	return &KVIndex{kv: kv}, nil
}

// Put records where forward fid is bound.
func (x *KVIndex) Put(ctx context.Context, fid string, e Entry) error {
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := x.kv.Put(ctx, fid, data); err != nil {
		return fmt.Errorf("index forward %s: %w", fid, err)
	}
	return nil
}

// Delete forgets forward fid.
func (x *KVIndex) Delete(ctx context.Context, fid string) error {
	if err := x.kv.Delete(ctx, fid); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("forget forward %s: %w", fid, err)
	}
	return nil
}

// All returns every forward the index holds.
func (x *KVIndex) All(ctx context.Context) (map[string]Entry, error) {
	out := map[string]Entry{}
	keys, err := x.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("forwards: %w", err)
	}
	for _, k := range keys {
		e, err := x.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("forward %s: %w", k, err)
		}
		var en Entry
		if err := json.Unmarshal(e.Value(), &en); err != nil {
			continue // not ours to read; it stays
		}
		out[k] = en
	}
	return out, nil
}
