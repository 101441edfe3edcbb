// Package memstore is an in-memory events.Store for tests and single-process
// tools. It keeps the semantics of the JetStream store (one global sequence,
// expected last sequence per sandbox, deduplication by message id, followers
// that keep their own position) without a server, and forgets everything
// when the process ends.
package memstore

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/torpor/torpor/events"
)

// Store is an in-memory event log. The zero value is not usable; call New.
type Store struct {
	mu        sync.Mutex
	log       []events.Envelope   // every event, log[i].Seq == i+1
	bySubject map[string][]uint64 // sandbox id → its sequences, ascending
	msgIDs    map[string]uint64   // dedup id → sequence
	changed   chan struct{}       // closed and replaced on every append
}

var _ events.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{
		bySubject: map[string][]uint64{},
		msgIDs:    map[string]uint64{},
		changed:   make(chan struct{}),
	}
}

// Append stores envs for sandbox id if its last event is at expected. Like
// the JetStream store on a standalone server, the concurrency check runs
// first and a mismatch whose last message is our last envelope counts as a
// retry that already landed.
func (s *Store) Append(ctx context.Context, id string, expected uint64, envs ...events.Envelope) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("append %s: %w", id, err)
	}
	if err := events.CheckAppend(id, envs); err != nil {
		return 0, fmt.Errorf("append %s: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()

	seqs := s.bySubject[id]
	var last uint64
	if len(seqs) > 0 {
		last = seqs[len(seqs)-1]
	}
	final := envs[len(envs)-1].DedupID()
	if last != expected {
		if last != 0 && s.log[last-1].DedupID() == final {
			return last, nil
		}
		return 0, fmt.Errorf("append %s: expected %d, last %d: %w", id, expected, last, events.ErrConflict)
	}
	for _, env := range envs {
		if seq, dup := s.msgIDs[env.DedupID()]; dup {
			if len(envs) == 1 {
				return seq, nil
			}
			return 0, fmt.Errorf("append %s: duplicate message id %s: %w", id, env.DedupID(), events.ErrConflict)
		}
	}
	for _, env := range envs {
		env.Seq = uint64(len(s.log) + 1)
		env.MsgID = env.DedupID()
		env.Data = slices.Clone(env.Data)
		s.log = append(s.log, env)
		s.bySubject[id] = append(s.bySubject[id], env.Seq)
		s.msgIDs[env.MsgID] = env.Seq
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return uint64(len(s.log)), nil
}

// Load returns the events of sandbox id above after.
func (s *Store) Load(ctx context.Context, id string, after uint64) ([]events.Envelope, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load %s: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seqs := s.bySubject[id]
	i, _ := slices.BinarySearch(seqs, after+1)
	out := make([]events.Envelope, 0, len(seqs)-i)
	for _, seq := range seqs[i:] {
		if env := s.log[seq-1]; events.Vet(env, id, env.Type) != nil {
			continue // foreign: every reader leaves it out
		}
		out = append(out, s.event(seq))
	}
	return out, nil
}

// Head is the sequence of sandbox id's last event, 0 when it has none.
func (s *Store) Head(ctx context.Context, id string) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("head of %s: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seqs := s.bySubject[id]
	if len(seqs) == 0 {
		return 0, nil
	}
	return seqs[len(seqs)-1], nil
}

// event returns a copy of the event at seq; s.mu is held.
func (s *Store) event(seq uint64) events.Envelope {
	env := s.log[seq-1]
	env.Data = slices.Clone(env.Data)
	return env
}

// LastSeq is the sequence of the newest event.
func (s *Store) LastSeq(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("last seq: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return uint64(len(s.log)), nil
}
