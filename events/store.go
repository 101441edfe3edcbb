package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

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

// BatchHandler handles a run of consecutive events (stream order); nil
// acknowledges them all, an error makes them all come again later.
type BatchHandler func(ctx context.Context, envs []Envelope) error

// BatchSubscriber is a Store that can deliver events in batches, so a
// consumer pays its per-write cost once per batch rather than per event.
// Both stores of this module implement it; it is optional for others.
type BatchSubscriber interface {
	// SubscribeBatch is Subscribe delivering up to max events at a time:
	// whatever is already available, without waiting to fill a batch. The
	// durable name is shared with Subscribe: either resumes after what the
	// other acknowledged. h may keep the envelopes, not the slice.
	SubscribeBatch(ctx context.Context, name string, max int, h BatchHandler) error
}

// CheckAppend rejects appends no store may hold: an id that cannot be a
// subject token, no events, an event of another sandbox or without an id.
// Every Store runs it first, so they refuse the same things.
func CheckAppend(id string, envs []Envelope) error {
	switch {
	case id == "":
		return errors.New("empty sandbox id")
	case strings.ContainsAny(id, ".*> \t\r\n"):
		return fmt.Errorf("sandbox id %q: no dots, wildcards or spaces", id)
	case len(envs) == 0:
		return errors.New("no events")
	}
	for _, env := range envs {
		if env.SandboxID != id {
			return fmt.Errorf("event %s is for sandbox %q", env.ID, env.SandboxID)
		}
		if env.DedupID() == "" {
			return fmt.Errorf("event of type %s has no id", env.Type)
		}
	}
	return nil
}
