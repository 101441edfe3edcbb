// Package memstore is an in-memory events.Store for tests and single-process
// tools. It keeps the semantics of the JetStream store (one global sequence,
// expected last sequence per sandbox, deduplication by message id, durable
// at-least-once subscriptions) without a server, and forgets everything when
// the process ends.
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/torpor/torpor/events"
)

// DefaultRedeliveryDelay is how long an event whose handler failed waits
// before it is delivered again.
const DefaultRedeliveryDelay = 20 * time.Millisecond

// Store is an in-memory event log. The zero value is not usable; call New.
type Store struct {
	// RedeliveryDelay is how long an event whose handler returned an error
	// waits before it comes again; set it before the first Subscribe.
	RedeliveryDelay time.Duration

	mu        sync.Mutex
	log       []events.Envelope   // every event, log[i].Seq == i+1
	bySubject map[string][]uint64 // sandbox id → its sequences, ascending
	msgIDs    map[string]uint64   // dedup id → sequence
	durables  map[string]*durable
	changed   chan struct{} // closed and replaced on every append
}

// durable is the position of one named subscription: everything up to
// delivered was handed out, and redo holds the ones to hand out again.
type durable struct {
	delivered uint64
	redo      []redelivery // sorted by due, then seq
}

type redelivery struct {
	seq uint64
	due time.Time
}

var (
	_ events.Store           = (*Store)(nil)
	_ events.BatchSubscriber = (*Store)(nil)
)

// New returns an empty store.
func New() *Store {
	return &Store{
		RedeliveryDelay: DefaultRedeliveryDelay,
		bySubject:       map[string][]uint64{},
		msgIDs:          map[string]uint64{},
		durables:        map[string]*durable{},
		changed:         make(chan struct{}),
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
		out = append(out, s.event(seq))
	}
	return out, nil
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

// Subscribe hands every event to h, one at a time, until ctx ends, and then
// returns nil. The durable name keeps its position in the Store: a later
// Subscribe with the same name resumes after the last acknowledged event. An
// event whose handler fails comes again after RedeliveryDelay while later
// events go on, as with a JetStream consumer; an event in hand when ctx ends
// comes again first to the next subscriber. Handlers must be idempotent. Use
// one Subscribe per name at a time.
func (s *Store) Subscribe(ctx context.Context, name string, h events.Handler) error {
	if name == "" {
		return errors.New("subscribe: empty durable name")
	}
	for {
		env, ok, wait := s.next(name)
		if !ok {
			if !wait.sleep(ctx) {
				return nil
			}
			continue
		}
		if ctx.Err() != nil {
			s.redo(name, env.Seq, 0)
			return nil
		}
		if err := h(ctx, env); err != nil {
			if ctx.Err() != nil {
				s.redo(name, env.Seq, 0)
				return nil
			}
			s.redo(name, env.Seq, s.RedeliveryDelay)
		}
	}
}

// waitFor says what a subscriber without an event waits for.
type waitFor struct {
	changed <-chan struct{}
	due     time.Duration // until the next redelivery; 0: none
}

// sleep waits until the log changes or the next redelivery is due; false
// when ctx ended first.
func (w waitFor) sleep(ctx context.Context) bool {
	var timer <-chan time.Time
	if w.due > 0 {
		timer = time.After(w.due)
	}
	select {
	case <-ctx.Done():
		return false
	case <-w.changed:
	case <-timer:
	}
	return true
}

// next takes the next event for durable name: a redelivery that is due,
// else the event after the delivered position.
func (s *Store) next(name string) (events.Envelope, bool, waitFor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.durables[name]
	if d == nil {
		d = &durable{}
		s.durables[name] = d
	}
	now := time.Now()
	if len(d.redo) > 0 && !d.redo[0].due.After(now) {
		seq := d.redo[0].seq
		d.redo = d.redo[1:]
		return s.event(seq), true, waitFor{}
	}
	if d.delivered < uint64(len(s.log)) {
		d.delivered++
		return s.event(d.delivered), true, waitFor{}
	}
	w := waitFor{changed: s.changed}
	if len(d.redo) > 0 {
		w.due = d.redo[0].due.Sub(now)
	}
	return events.Envelope{}, false, w
}

// redo schedules seq to come again to durable name after delay.
func (s *Store) redo(name string, seq uint64, delay time.Duration) {
	s.redoAt(name, seq, time.Now().Add(delay))
}

// redoAt schedules seq to come again to durable name at due.
func (s *Store) redoAt(name string, seq uint64, due time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.durables[name]
	r := redelivery{seq: seq, due: due}
	i, _ := slices.BinarySearchFunc(d.redo, r, func(a, b redelivery) int {
		if c := a.due.Compare(b.due); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	d.redo = slices.Insert(d.redo, i, r)
}

// SubscribeBatch is Subscribe handing h up to max events at a time: the
// redeliveries that are due, then the events after the delivered position,
// as many as there are, without waiting for more. When h fails, every event
// of the batch comes again after RedeliveryDelay.
func (s *Store) SubscribeBatch(ctx context.Context, name string, max int, h events.BatchHandler) error {
	if name == "" {
		return errors.New("subscribe: empty durable name")
	}
	if max < 1 {
		return fmt.Errorf("subscribe %s: batch size %d: want 1 or more", name, max)
	}
	for {
		envs, wait := s.nextBatch(name, max)
		if len(envs) == 0 {
			if !wait.sleep(ctx) {
				return nil
			}
			continue
		}
		if ctx.Err() != nil {
			s.redoAll(name, envs, 0)
			return nil
		}
		if err := h(ctx, envs); err != nil {
			if ctx.Err() != nil {
				s.redoAll(name, envs, 0)
				return nil
			}
			s.redoAll(name, envs, s.RedeliveryDelay)
		}
	}
}

// nextBatch takes up to max events for durable name, the way next takes one.
func (s *Store) nextBatch(name string, max int) ([]events.Envelope, waitFor) {
	var out []events.Envelope
	for len(out) < max {
		env, ok, wait := s.next(name)
		if !ok {
			return out, wait
		}
		out = append(out, env)
	}
	return out, waitFor{}
}

// redoAll schedules every event of envs to come again after delay.
func (s *Store) redoAll(name string, envs []events.Envelope, delay time.Duration) {
	due := time.Now().Add(delay)
	for _, env := range envs {
		s.redoAt(name, env.Seq, due)
	}
}
