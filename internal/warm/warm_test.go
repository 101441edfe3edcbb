package warm

import (
	"sync"
	"testing"
	"testing/synctest"
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

// TestCloseEndsEveryGoroutine: Close ends the idle goroutines at once (the
// keep-alive is an hour) and returns only when the running tasks have
// finished on theirs; then the pool holds none.
func TestCloseEndsEveryGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(time.Hour)
		release, others := make(chan struct{}), make(chan struct{})
		var finished sync.WaitGroup
		finished.Add(3)
		for i := range 3 {
			p.Go(func() {
				defer finished.Done()
				if i == 0 {
					<-release // still running when Close is called
					return
				}
				<-others
			})
		}
		synctest.Wait() // all three running, each on a goroutine of its own
		close(others)
		synctest.Wait() // two of them done, their goroutines idle
		if got := p.Live(); got != 3 {
			t.Fatalf("%d goroutines before Close, want 3 (one running, two idle)", got)
		}

		closed := make(chan struct{})
		go func() { p.Close(); close(closed) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while a task was running")
		default:
		}
		if got := p.Live(); got != 1 {
			t.Errorf("%d goroutines while Close waits, want 1: the idle ones end at once", got)
		}
		close(release)
		<-closed
		if got := p.Live(); got != 0 {
			t.Errorf("%d goroutines after Close, want 0", got)
		}
		finished.Wait()
	})
}

// TestGoAfterCloseRunsOnTheCaller: a task given after Close runs before Go
// returns, on no goroutine of the pool; Close may be called again.
func TestGoAfterCloseRunsOnTheCaller(t *testing.T) {
	p := New(time.Hour)
	p.Go(func() {})
	p.Close()
	ran := false
	p.Go(func() { ran = true })
	if !ran {
		t.Error("a task given after Close had not run when Go returned")
	}
	if got := p.started.Load(); got != 1 {
		t.Errorf("%d goroutines started, want none after Close", got)
	}
	p.Close()
	if got := p.Live(); got != 0 {
		t.Errorf("%d goroutines after Close, want 0", got)
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
