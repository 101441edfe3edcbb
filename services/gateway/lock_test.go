package gateway

import (
	"sync"
	"testing"
	"time"
)

// TestLockHandsOverInOrder checks that a goroutine that unlocks and locks
// again at once does not overtake one that was already waiting: a supervisor
// report waiting on a sandbox goes before the saga's next record. (With
// sync.Mutex the unlocking goroutine usually wins.)
func TestLockHandsOverInOrder(t *testing.T) {
	for round := range 20 {
		l := newFIFOLock()
		var (
			mu    sync.Mutex
			order []string
		)
		took := func(who string) {
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
		}
		l.Lock()
		waiting := make(chan struct{})
		done := make(chan struct{})
		go func() {
			close(waiting)
			l.Lock()
			took("waiter")
			l.Unlock()
			close(done)
		}()
		<-waiting
		// Give the waiter time to block in Lock; the order below is what is
		// checked, not how long anything took.
		time.Sleep(20 * time.Millisecond)
		l.Unlock()
		l.Lock()
		took("holder again")
		l.Unlock()
		<-done
		if order[0] != "waiter" {
			t.Fatalf("round %d: %v: the holder took the lock again before the goroutine waiting for it", round, order)
		}
	}
}
