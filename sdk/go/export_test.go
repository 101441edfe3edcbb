package torpor

import (
	"context"

	"github.com/torpor/torpor/events"
)

// WatchOnce is one watch of the bucket with the deduplication state seen,
// as Bus.Watch makes again when one closes: for the test of what a second
// watch delivers.
func (b *Bus) WatchOnce(ctx context.Context, after uint64, seen map[string]uint64, fn func(events.View) error) error {
	return b.watchOnce(ctx, after, seen, fn)
}
