package warm

import (
	"sync"
	"testing"
	"time"
)

// TestEveryTaskRuns runs many tasks at once, some blocked until all have
// started: none waits for another to finish, and each runs once.
func TestEveryTaskRuns(t *testing.T) {
	p := New(time.Second)
	const n = 200
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ran     = map[int]int{}
		release = make(chan struct{})
		started sync.WaitGroup
	)
	wg.Add(n)
	started.Add(n)
	for i := range n {
		p.Go(func() {
			defer wg.Done()
			started.Done()
			<-release // every task holds its goroutine until all have started
			mu.Lock()
			ran[i]++
			mu.Unlock()
		})
	}
	started.Wait()
	close(release)
	wg.Wait()
	if len(ran) != n {
		t.Fatalf("%d tasks ran, want %d", len(ran), n)
	}
	for i, k := range ran {
		if k != 1 {
			t.Errorf("task %d ran %d times", i, k)
		}
	}
	if got := p.started.Load(); got != n {
		t.Errorf("%d goroutines for %d tasks blocked at once, want one each", got, n)
	}
}

// TestGoroutinesAreReusedThenEnd checks that tasks one after another run on
// goroutines the pool already has, and that an idle goroutine ends after the
// keep-alive. Each task is started a millisecond after the one before it
// finished, time enough for its goroutine to wait for the next; a few
// misses on a loaded machine are allowed, a new goroutine per task is not.
func TestGoroutinesAreReusedThenEnd(t *testing.T) {
	p := New(time.Second)
	const n = 100
	for range n {
		done := make(chan struct{})
		p.Go(func() { close(done) })
		<-done
		time.Sleep(time.Millisecond)
	}
	if got := p.started.Load(); got > n/10 {
		t.Errorf("%d goroutines for %d tasks one after another, want a few at most", got, n)
	}

	q := New(20 * time.Millisecond)
	done := make(chan struct{})
	q.Go(func() { close(done) })
	<-done
	waitFor(t, "the idle goroutine to end", func() bool { return q.live.Load() == 0 })
	done = make(chan struct{})
	q.Go(func() { close(done) })
	<-done
	if got := q.started.Load(); got != 2 {
		t.Errorf("%d goroutines started, want a second one after the first ended", got)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
