package gateway

import (
	"context"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
)

// KeyTTL is the least time an idempotency key holds. A keyed command on a
// sandbox is remembered from the sandbox's own log for as long as the log
// keeps its events (longer than KeyTTL, which is the bound the contract
// promises): a retry with the key, after any number of other commands,
// after the bus's deduplication window and across a restart (the state is
// folded again from the log), answers what the first one answered, the
// view right after its events, and appends nothing. A create's key maps to
// its sandbox id in the KV bucket torpor_create_keys for exactly KeyTTL:
// a create with a key older than that is decided again and makes a new
// sandbox. A keyed command that appended nothing (a refusal, an idempotent
// repeat) left no trace in the log and is decided again on a retry: it had
// no effect, so deciding it again cannot cause a second one.
const KeyTTL = 24 * time.Hour

// keyOf is what a sandbox keeps of commandID: its 16 bytes (a name-based
// uuid for an id that is not one), and false for a fresh id (CommandID with
// no key: a uuid version 7), which is never retried, or none.
func keyOf(commandID string) ([16]byte, bool) {
	if commandID == "" {
		return [16]byte{}, false
	}
	u, err := uuid.Parse(commandID)
	if err != nil {
		return uuid.NewSHA1(idempotent, []byte(commandID)), true
	}
	return u, u.Version() != 7
}

// keyed returns the sequence of the last event keyed command commandID
// appended (0 while it is not yet stored), and whether the sandbox holds it.
func (s *Sandbox) keyed(commandID string) (uint64, bool) {
	k, ok := keyOf(commandID)
	if !ok {
		return 0, false
	}
	if seq, ok := s.keys[k]; ok {
		return seq, true
	}
	return 0, slices.Contains(s.pending, k)
}

// note records what env tells about commands: a keyed command's own event
// (one with no causation: the events a command appends; what sagas and
// supervisors report about it is caused by them) marks the key with its
// sequence; an intent names the command under way.
//
// The map of keys is shared by a state and the states cloned from it, so
// that an append costs no copy of it: only facts of the log go into it (a
// stored event's sequence), under the sandbox's lock. An event folded
// before its append has no sequence yet: its key waits in pending, which
// is the clone's own, until stamp (a failed append drops it with the clone).
func (s *Sandbox) note(env events.Envelope) {
	if env.CommandID == "" {
		return
	}
	if events.Intent(env.Type) {
		s.Intent = env.CommandID
	}
	if env.CausationID != "" {
		return
	}
	k, ok := keyOf(env.CommandID)
	switch {
	case !ok:
	case env.Seq == 0:
		if !slices.Contains(s.pending, k) {
			s.pending = append(s.pending, k)
		}
	default:
		s.mark(k, env.Seq)
	}
}

func (s *Sandbox) mark(k [16]byte, seq uint64) {
	if s.keys == nil {
		s.keys = map[[16]byte]uint64{}
	}
	s.keys[k] = seq
}

// stamp sets the stored sequence seq of an append into the state folded
// from it without one: its Seq, its view's, and the keys it marked.
func (s *Sandbox) stamp(seq uint64) {
	s.Seq, s.View.Seq = seq, seq
	for _, k := range s.pending {
		s.mark(k, seq)
	}
	s.pending = nil
}

// answer is what command c, decided on sb, answers. A keyed command that is
// in the log answers the view right after its own events, whatever came
// since (the first answer, again). A command that joined a twin already in
// flight (see joined) answers the view naming that command in
// View.Joined.
func (s *Service) answer(ctx context.Context, c Command, sb *Sandbox) (events.View, error) {
	if seq, ok := sb.keyed(c.CommandID); ok && seq != 0 && seq != sb.View.Seq {
		return s.ViewAt(ctx, sb.ID, seq, time.Time{})
	}
	v := sb.View
	if twin := sb.joined(c); twin != "" {
		v.Joined = twin
	}
	return v, nil
}

// twins are the verbs whose command joins one of its kind under way in a
// transient phase: a suspend on suspending is the suspend in flight, and
// that one's outcome (suspended, or ready if the driver rejects it) is the
// answer's. A start on starting joins a start; during a resume it is
// refused (Busy): the resume failing would leave the start undone.
var twins = map[events.Phase]string{
	events.PhaseStarting:   VerbStart,
	events.PhaseStopping:   VerbStop,
	events.PhaseSuspending: VerbSuspend,
	events.PhaseDeleting:   VerbDelete,
}

// joined is the id of the command c joins: the intent under way in sb's
// transient phase, of c's verb (a resume on starting after a resume joins
// the resume), when it is not c itself; "" for none.
func (s *Sandbox) joined(c Command) string {
	verb, ok := twins[s.Phase]
	if s.Phase == events.PhaseStarting && s.Resuming {
		verb, ok = VerbResume, true
	}
	if !ok || verb != c.Verb || s.Intent == "" || s.Intent == c.CommandID {
		return ""
	}
	return s.Intent
}
