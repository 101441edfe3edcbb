package events

import "context"

// Store is the event log: one subject per sandbox, appends guarded by the
// expected last sequence of that subject and deduplicated by message id.
//
// Every implementation passes the contract suite in events/storetest.
type Store interface {
	// Append stores envs (all for sandbox id, at least one) atomically, if and
	// only if the last event of that sandbox is at expected (0: none yet). Each
	// envelope's DedupID is its message id. It returns the sequence of the last
	// envelope stored, or an error wrapping ErrConflict when the subject moved.
	// An append that landed but whose answer was lost (timeout, retry) is
	// resolved by reading the subject's last message and comparing message ids.
	Append(ctx context.Context, id string, expected uint64, envs ...Envelope) (uint64, error)
	// Load returns the events of sandbox id with a sequence above after, in
	// order, with Seq set. A sandbox without events yields an empty slice.
	Load(ctx context.Context, id string, after uint64) ([]Envelope, error)
	// Subscribe delivers every event of every sandbox to h in stream order,
	// starting after the last event the durable consumer name acknowledged,
	// until ctx ends. An event is acknowledged when h returns nil; an error
	// makes it come again later. Delivery is at least once.
	Subscribe(ctx context.Context, name string, h Handler) error
	// LastSeq is the sequence of the newest event in the whole log.
	LastSeq(ctx context.Context) (uint64, error)
}

// Handler handles one delivered event.
type Handler func(ctx context.Context, env Envelope) error
