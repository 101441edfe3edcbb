package gateway

import (
	"context"

	"github.com/torpor/torpor/events"
)

// ListQuery selects sandboxes for a list (CONTRACT §5).
type ListQuery struct {
	Phase  events.Phase
	Label  string // "key=value"
	Name   string // a substring of the name, in any case
	Driver string
	Node   string
	// Sort is created (or empty), name, -name, age (the longest in its
	// phase first) or -age.
	Sort   string
	Limit  int
	Cursor string
}

// Views reads the phase view projection (the KV view by default).
type Views interface {
	Get(ctx context.Context, id string) (events.View, error)
	List(ctx context.Context, q ListQuery) (events.Page, error)
	// Wait returns when id's view reaches phase at a seq above after;
	// FAILED_PRECONDITION if it reached a terminal phase instead.
	Wait(ctx context.Context, id string, phase events.Phase, after uint64) (events.View, error)
	// Settle returns the first view of id at a seq above after whose
	// phase is not transient: the outcome of a command answered there
	// (?wait=true). When ctx ends it returns the last view it saw and an
	// error wrapping ctx.Err().
	Settle(ctx context.Context, id string, after uint64) (events.View, error)
	Counts(ctx context.Context) (map[events.Phase]int, error)
	// Watch streams view changes with a seq above after until ctx ends.
	Watch(ctx context.Context, after uint64) (<-chan events.View, error)
}

// Histories is a Views that also keeps the audit history (the SQL view's
// torpor_history): the history endpoint reads the events it holds there
// and only the ones it has yet to hold from the log (Service.HistoryFrom).
type Histories interface {
	// History returns the events of id above seq after that the view
	// holds, in log order; none for a sandbox it does not know.
	History(ctx context.Context, id string, after uint64) ([]events.Envelope, error)
}
