package access

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// QuotaBucket keeps which token made which sandbox: key <token>.<sandbox
// id>, for the quota of sandboxes per token.
const QuotaBucket = "torpor_token_sandboxes"

// Quota counts the sandboxes each token made and has not deleted. A token's
// keys are listed by their prefix, so a count costs as many keys as the
// token holds, which its quota bounds.
type Quota struct{ kv jetstream.KeyValue }

// OpenQuota creates or binds the bucket.
func OpenQuota(ctx context.Context, js jetstream.JetStream, replicas int) (*Quota, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: QuotaBucket, Description: "torpor: the sandboxes each HTTP token made, for its quota", History: 1,
		Replicas: max(replicas, 1), MaxValueSize: 64, MaxBytes: 256 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("quota bucket: %w", err)
	}
	return &Quota{kv: kv}, nil
}

// Held returns the ids of the sandboxes token holds.
func (q *Quota) Held(ctx context.Context, token string) ([]string, error) {
	if err := events.CheckTokenName(token); err != nil {
		return nil, err
	}
	lister, err := q.kv.ListKeysFiltered(ctx, token+".*")
	if err != nil {
		return nil, events.Errorf(events.CodeUnavailable, "quota of %s: %v", token, err)
	}
	var ids []string
	for k := range lister.Keys() {
		ids = append(ids, strings.TrimPrefix(k, token+"."))
	}
	return ids, nil
}

// Hold counts sandbox id against token.
func (q *Quota) Hold(ctx context.Context, token, id string) error {
	if err := events.CheckTokenName(token); err != nil {
		return err
	}
	if _, err := q.kv.Put(ctx, token+"."+id, nil); err != nil {
		return events.Errorf(events.CodeUnavailable, "quota of %s: %v", token, err)
	}
	return nil
}

// Release counts sandbox id against nobody any more.
func (q *Quota) Release(ctx context.Context, id string) error {
	lister, err := q.kv.ListKeysFiltered(ctx, "*."+id)
	if err != nil {
		return events.Errorf(events.CodeUnavailable, "quota: %v", err)
	}
	var errs []error
	for k := range lister.Keys() {
		if err := q.kv.Purge(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return events.Errorf(events.CodeUnavailable, "quota: %v", err)
	}
	return nil
}
