package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events/jsstore"
)

// legacyDurables are the durable consumers builds before the followers kept
// their own positions used: the sagas' ack floor and look-ahead, the view.
var legacyDurables = []string{"sagas", "sagas-ahead", "kvview"}

// retireDurables removes the legacy durable consumers from the log's stream,
// which would otherwise stay on the server and be told of every event for
// nothing. When the sagas have no position yet, the old "sagas" consumer's
// ack floor becomes it: every intent up to there had finished, so a first
// start on an old log does not re-check them all.
func retireDurables(ctx context.Context, store *jsstore.Store, pos *jsstore.Position) error {
	for _, name := range legacyDurables {
		c, err := store.Stream().Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("legacy consumer %s: %w", name, err)
		}
		if name == "sagas" {
			info, err := c.Info(ctx)
			if err != nil {
				return fmt.Errorf("legacy consumer %s: %w", name, err)
			}
			cur, err := pos.Get(ctx)
			if err != nil {
				return err
			}
			if cur == 0 && info.AckFloor.Stream > 0 {
				if err := pos.Set(ctx, info.AckFloor.Stream); err != nil {
					return err
				}
			}
		}
		if err := store.Stream().DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("delete legacy consumer %s: %w", name, err)
		}
	}
	return nil
}
