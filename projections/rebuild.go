package projections

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/torpor/torpor/events"
)

// Log is what a view's rebuild reads (torpor replay): the whole log in
// order, and its head. jsstore.Store satisfies it.
type Log interface {
	// Replay hands every event from sequence from up to the log's last
	// sequence at the call to h, in order and in chunks (h may keep the
	// envelopes, not the slice), and returns that last sequence.
	Replay(ctx context.Context, from uint64, h func([]events.Envelope) error) (uint64, error)
	// LastSeq is the sequence of the newest event in the log.
	LastSeq(ctx context.Context) (uint64, error)
}

// The phases of a rebuild, in order, as Progress reports them.
const (
	PhaseFold    = "fold"
	PhaseWrite   = "write"
	PhaseCatchUp = "catchup"
	PhaseSwap    = "swap"
	PhaseDone    = "done"
)

// Progress is how far a rebuild is: in Phase, the log is read up to
// sequence Done of Total (the log's last sequence when the phase began, or
// the sequence of the past being built).
type Progress struct {
	Phase       string
	Done, Total uint64
}

// RebuildOptions say what a view's rebuild builds.
type RebuildOptions struct {
	// Until, when not 0, builds the view of the past at that sequence
	// (beside the live one, never swapped in) instead of rebuilding the
	// live view.
	Until uint64
	// UntilTime, when Until is 0 and this is not zero, is resolved to the
	// last sequence at or before it: the log up to its first event whose
	// time is after UntilTime.
	UntilTime time.Time
	// Progress, when not nil, is called as the rebuild goes, from one
	// goroutine at a time; it must be quick.
	Progress func(Progress)
	// CatchUpRounds bounds the catch-up rounds before the swap; default 5.
	// The swap catches up whatever is left anyway.
	CatchUpRounds int
}

// ReplayUntil reads src from its first event and sends each chunk of it,
// copied, on chunks: up to sequence until when that is not 0, else up to
// the last event whose time is not after untilTime when that is not zero,
// else the whole log. It returns the last sequence src covered and whether
// it stopped at until or untilTime (cut); it does not close chunks.
func ReplayUntil(ctx context.Context, src interface {
	Replay(ctx context.Context, from uint64, h func([]events.Envelope) error) (uint64, error)
}, until uint64, untilTime time.Time, chunks chan<- []events.Envelope) (end uint64, cut bool, err error) {
	end, err = src.Replay(ctx, 1, func(envs []events.Envelope) error {
		for i, env := range envs {
			if (until != 0 && env.Seq > until) || (!untilTime.IsZero() && env.Time.After(untilTime)) {
				envs, cut = envs[:i], true
				break
			}
		}
		if until != 0 && len(envs) > 0 && envs[len(envs)-1].Seq >= until {
			cut = true
		}
		if len(envs) > 0 {
			select {
			case chunks <- slices.Clone(envs):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if cut {
			return errUntil
		}
		return nil
	})
	if errors.Is(err, errUntil) {
		err = nil
	}
	return end, cut, err
}

// errUntil stops a replay at the sequence of the past being built.
var errUntil = errors.New("until reached")
