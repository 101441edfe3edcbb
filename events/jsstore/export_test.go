package jsstore

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
