package main

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/events/storetest"
	"github.com/torpor/torpor/sagas"
)

// TestRetireDurables: the durable consumers of earlier builds are removed;
// the old sagas' ack floor becomes the sagas' position when they have none,
// and a saved position stays.
func TestRetireDurables(t *testing.T) {
	for _, tc := range []struct {
		name  string
		saved uint64 // position saved before, 0 for none
		want  uint64
	}{
		{"no position yet: the ack floor", 0, 4},
		{"a saved position stays", 7, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			srv := natstest.Start(t)
			store, err := jsstore.New(ctx, srv.JS, jsstore.Config{})
			if err != nil {
				t.Fatal(err)
			}
			var last uint64
			for i := range 10 {
				env := storetest.NewEnvelope(t, "sbx1", &events.Started{Generation: int64(i)})
				if last, err = store.Append(ctx, "sbx1", last, env); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range legacyDurables {
				if _, err := store.Stream().CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
					t.Fatal(err)
				}
			}
			old, _ := store.Stream().Consumer(ctx, "sagas")
			batch, err := old.Fetch(4)
			if err != nil {
				t.Fatal(err)
			}
			for msg := range batch.Messages() {
				if err := msg.DoubleAck(ctx); err != nil {
					t.Fatal(err)
				}
			}
			pos, err := store.Position(ctx, sagas.PositionKey("local"))
			if err != nil {
				t.Fatal(err)
			}
			if tc.saved > 0 {
				if err := pos.Set(ctx, tc.saved); err != nil {
					t.Fatal(err)
				}
			}

			if err := retireDurables(ctx, store, pos); err != nil {
				t.Fatal(err)
			}
			if got, err := pos.Get(ctx); err != nil || got != tc.want {
				t.Errorf("position = %d, %v; want %d", got, err, tc.want)
			}
			for _, name := range legacyDurables {
				if _, err := store.Stream().Consumer(ctx, name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
					t.Errorf("consumer %s: %v, want it gone", name, err)
				}
			}
			// Nothing left to retire: a no-op.
			if err := retireDurables(ctx, store, pos); err != nil {
				t.Fatal(err)
			}
		})
	}
}
