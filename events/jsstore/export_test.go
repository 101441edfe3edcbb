package jsstore

import "time"

// HoldGroup makes s's group commit busy, as if an append were in flight:
// appends queue (their lengths on the returned channel) until release sends
// them as one group. Every group of two or more goes as one batch, whatever
// the costs say.
func HoldGroup(s *Store) (queued <-chan int, release func()) {
	g := &s.group
	g.mu.Lock()
	defer g.mu.Unlock()
	g.busy, g.always = true, true
	q := make(chan int, 1000)
	g.queued = q
	return q, func() { g.next(s) }
}

// Batched is how many batches of group commit landed, with how many appends.
func Batched(s *Store) (batches, appends uint64) {
	return s.group.batches.Load(), s.group.batched.Load()
}

// AppendBound is how long an append waits at most on a log that does not
// answer (appendBound).
const AppendBound = appendBound

// SetAnswerTimeout sets how long s waits for a publish's answer (its
// answerTimeout), with nothing in flight.
func SetAnswerTimeout(s *Store, d time.Duration) { s.answerTimeout = d }
