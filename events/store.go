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
	// A foreign message on the subject (see Vet) is left out.
	Load(ctx context.Context, id string, after uint64) ([]Envelope, error)
	// Head is the sequence of the last message on sandbox id's subject (0:
	// none), foreign or not: what an append must expect, and how a reader
	// tells that a state folded from Load is current.
	Head(ctx context.Context, id string) (uint64, error)
	// Follow hands every event with a sequence above after to h, in stream
	// order, in batches of up to max events: whatever has arrived when h is
	// free, never waiting to fill a batch. It runs until ctx ends (then it
	// returns nil) or h returns an error (then it returns that error).
	//
	// Nothing is kept for the follower in the store: it keeps its own
	// position (a checkpoint) and passes it as after when it follows again,
	// so delivery is at least once and h must be idempotent. pending is how
	// many events the log held after the batch's last one when that one was
	// delivered: 0 means the batch reached the head of the log, so the
	// follower has seen every event up to that moment. h may keep the
	// envelopes but not the slice. A foreign message is left out.
	Follow(ctx context.Context, after uint64, max int, h FollowHandler) error
	// LastSeq is the sequence of the newest event in the whole log.
	LastSeq(ctx context.Context) (uint64, error)
}

// PositionBucket is the NATS KV bucket where the followers of the
// JetStream log keep their positions (Store.Follow keeps none for them):
// follower name → the sequence of the last event it handled, in decimal.
// jsstore's Position and the KV view's checkpoint both live there; the name
// is here because neither of those packages may import the other.
const PositionBucket = "torpor_positions"

// PositionBucketMaxBytes bounds the positions bucket's storage (a few keys
// of a few bytes each), wherever it is made.
const PositionBucketMaxBytes = 16 << 20

// FollowHandler handles a run of consecutive events of the log (see
// Store.Follow); pending counts the events after the last of them.
type FollowHandler func(ctx context.Context, envs []Envelope, pending uint64) error

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
