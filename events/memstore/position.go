package memstore

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Position is a follower's checkpoint in memory: the sequence of the last
// event it handled, to pass to Follow as after when it follows again. It
// stands in for jsstore's Position in tests and single-process tools. The
// zero value is at 0 (the start of the log); it is safe for concurrent use.
type Position struct {
	seq atomic.Uint64
}

// Get returns the position last Set, 0 before any.
func (p *Position) Get(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("get position: %w", err)
	}
	return p.seq.Load(), nil
}

// Set stores seq as it is, even below the current position: the follower
// decides where it is (moving back replays events, which it handles
// idempotently anyway).
func (p *Position) Set(ctx context.Context, seq uint64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("set position %d: %w", seq, err)
	}
	p.seq.Store(seq)
	return nil
}
