package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// KVNames keeps name reservations in the KV bucket torpor_names (key = name,
// value = sandbox id) and create idempotency keys in torpor_create_keys, whose
// entries expire after KeyTTL.
type KVNames struct {
	names jetstream.KeyValue
	keys  jetstream.KeyValue
}

var _ Names = (*KVNames)(nil)

// namesBound is how long a call on the names and keys buckets waits at
// most for the bus, whatever its caller's deadline (a create's is
// CreateTimeout, 10 s): a bucket without a leader (an election after a
// server died, or a quorum lost) answers nothing until its leader steps
// down, and the create answers UNAVAILABLE (natserr: the bus did not
// answer, each call's error wrapped so) within the bound, as an append does (jsstore's 3 s, then 1 s to
// resolve), so a client retries it under its key rather than time out
// itself.
const namesBound = 3 * time.Second

// bound is ctx, ended after namesBound at the latest.
func bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, namesBound)
}

// NewKVNames creates or binds the two buckets.
func NewKVNames(ctx context.Context, js jetstream.JetStream, replicas int) (*KVNames, error) {
	if replicas < 1 {
		replicas = 1
	}
	names, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: "torpor_names", Description: "sandbox name → id, unique among sandboxes not deleted", Replicas: replicas,
		MaxBytes: 256 << 20, MaxValueSize: 1 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("names bucket: %w", err)
	}
	keys, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: "torpor_create_keys", Description: "create idempotency key → sandbox id", TTL: KeyTTL, Replicas: replicas,
		MaxBytes: 256 << 20, MaxValueSize: 1 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("create keys bucket: %w", err)
	}
	return &KVNames{names: names, keys: keys}, nil
}

// Reserve claims name for id.
func (n *KVNames) Reserve(ctx context.Context, name, id string) (Holder, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	_, err := n.names.Create(ctx, name, []byte(id))
	if err == nil {
		return Holder{ID: id}, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return Holder{}, fmt.Errorf("reserve %s: %w", name, natserr.Unavailable(exhausted(err)))
	}
	e, gerr := n.names.Get(ctx, name)
	if gerr != nil {
		return Holder{}, fmt.Errorf("reserve %s: %w", name, natserr.Unavailable(gerr))
	}
	h := Holder{ID: string(e.Value()), Since: e.Created()}
	if h.ID == id {
		return h, nil
	}
	return h, fmt.Errorf("%w: %s held by %s", ErrNameTaken, name, h.ID)
}

// Take moves name from holder to id, if holder still holds it.
func (n *KVNames) Take(ctx context.Context, name, holder, id string) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	e, err := n.names.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		_, err = n.names.Create(ctx, name, []byte(id))
		return err
	}
	if err != nil {
		return err
	}
	if string(e.Value()) != holder {
		return fmt.Errorf("name %s changed hands", name)
	}
	_, err = n.names.Update(ctx, name, []byte(id), e.Revision())
	return err
}

// Release frees name if id holds it.
func (n *KVNames) Release(ctx context.Context, name, id string) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	e, err := n.names.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release %s: %w", name, natserr.Unavailable(err))
	}
	if string(e.Value()) != id {
		return nil
	}
	if err := n.names.Delete(ctx, name, jetstream.LastRevision(e.Revision())); err != nil {
		return fmt.Errorf("release %s: %w", name, natserr.Unavailable(err))
	}
	return nil
}

// Lookup returns the id holding name.
func (n *KVNames) Lookup(ctx context.Context, name string) (string, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	e, err := n.names.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", fmt.Errorf("name %s: %w", name, events.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("name %s: %w", name, natserr.Unavailable(err))
	}
	return string(e.Value()), nil
}

// exhausted is err as RESOURCE_EXHAUSTED when the server refused the write
// for want of storage (a bucket at its MaxBytes answers 10077 "maximum
// bytes exceeded"; a server or account out of storage 10023, 10047 or
// 10028), else err.
func exhausted(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch {
	case apiErr.ErrorCode == 10023 || apiErr.ErrorCode == 10047 || apiErr.ErrorCode == 10028,
		apiErr.ErrorCode == 10077 && strings.Contains(apiErr.Description, "maximum "):
		return events.Errorf(events.CodeResourceExhausted, "storage full: %w", err)
	}
	return err
}

// Claim maps an idempotency key to id once.
func (n *KVNames) Claim(ctx context.Context, key, id string) (string, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	sum := sha256.Sum256([]byte(key))
	k := hex.EncodeToString(sum[:])
	if _, err := n.keys.Create(ctx, k, []byte(id)); err == nil {
		return id, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return "", fmt.Errorf("idempotency key: %w", natserr.Unavailable(exhausted(err)))
	}
	e, err := n.keys.Get(ctx, k)
	if err != nil {
		return "", fmt.Errorf("idempotency key: %w", natserr.Unavailable(err))
	}
	return string(e.Value()), nil
}
