package jsstore

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// Foreign is a message on a sandbox's subject that every reader of the store
// skips (events.ErrForeign): Err says why.
type Foreign struct {
	Seq     uint64
	Subject string
	Err     error
}

// foreignSeen bounds the sequences a store remembers having reported, so
// that each foreign message is reported once however often it is read.
const foreignSeen = 4096

// foreign counts the foreign messages a store skipped and reports each
// once.
type foreign struct {
	report func(Foreign)
	n      atomic.Uint64
	mu     sync.Mutex
	seen   map[uint64]bool
}

// skip records that the message at seq on subject was skipped for err.
func (f *foreign) skip(seq uint64, subject string, err error) {
	f.mu.Lock()
	if f.seen[seq] {
		f.mu.Unlock()
		return
	}
	if f.seen == nil || len(f.seen) >= foreignSeen {
		f.seen = map[uint64]bool{}
	}
	f.seen[seq] = true
	f.mu.Unlock()
	f.n.Add(1)
	if f.report != nil {
		f.report(Foreign{Seq: seq, Subject: subject, Err: err})
	}
}

// Foreign is how many distinct foreign messages this store skipped (each
// counted once while it is among the last few thousand it reported).
func (s *Store) Foreign() uint64 { return s.foreign.n.Load() }

// vet decodes the body of the message at seq on subject, with type header
// typ, into an envelope every reader can use, or an error wrapping
// events.ErrForeign.
func vet(data []byte, subject, typ string) (events.Envelope, error) {
	env, err := events.DecodeEnvelope(data)
	if err != nil {
		return env, fmt.Errorf("%w: %w", events.ErrForeign, err)
	}
	if err := events.Vet(env, strings.TrimPrefix(subject, SubjectPrefix), typ); err != nil {
		return env, err
	}
	return env, nil
}

// envelope vets the message at seq on subject, with headers h and body
// data, into its envelope with Seq and MsgID set. A foreign message is
// counted and reported (see Foreign) and comes back as vet's error.
func (s *Store) envelope(seq uint64, subject string, h nats.Header, data []byte) (events.Envelope, error) {
	env, err := vet(data, subject, h.Get(HeaderType))
	if err != nil {
		s.foreign.skip(seq, subject, err)
		return env, err
	}
	env.Seq, env.MsgID = seq, h.Get(jetstream.MsgIDHeader)
	return env, nil
}
