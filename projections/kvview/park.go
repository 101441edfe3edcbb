package kvview

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// ParkedBucket is the KV bucket where the KV view records the events it
// cannot apply (projections.ErrUnapplicable: a sandbox id that cannot be a
// key), one key per event: <view>.<seq>.
const ParkedBucket = "torpor_parked"

// Parked is what ParkedBucket holds of one event.
type Parked struct {
	View      string          `json:"view"`
	Seq       uint64          `json:"seq"`
	SandboxID string          `json:"sandbox_id"`
	Type      string          `json:"type"`
	Error     string          `json:"error"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// Park records env in ParkedBucket (made when missing) with why: the
// runner goes on with the rest of the log (projections.Parker). Parking an
// event again rewrites the same key.
func (v *View) Park(ctx context.Context, env events.Envelope, why error) error {
	kv, err := v.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       ParkedBucket,
		Description:  "torpor: events a view cannot apply",
		Storage:      jetstream.FileStorage,
		MaxBytes:     256 << 20,
		MaxValueSize: MaxValueSize,
		Replicas:     v.cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("park: bucket %s: %w", ParkedBucket, err)
	}
	data := env.Data
	if !json.Valid(data) {
		data = nil
	}
	b, err := json.Marshal(Parked{View: v.Name(), Seq: env.Seq, SandboxID: env.SandboxID, Type: env.Type, Error: why.Error(), Data: data})
	if err != nil {
		return fmt.Errorf("park: %w", err)
	}
	if _, err := kv.Put(ctx, fmt.Sprintf("%s.%d", v.Name(), env.Seq), b); err != nil {
		return fmt.Errorf("park seq %d: %w", env.Seq, err)
	}
	return nil
}
