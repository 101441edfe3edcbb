// Package warm runs short tasks each on a goroutine of its own, reusing
// goroutines that finished a task a moment ago. A new goroutine starts on a
// small stack and grows it, copying, the first time a task calls deep (JSON,
// a NATS request), as torpor's saga steps and bus commands do; a goroutine
// kept warm has its stack grown already. BenchmarkGo and BenchmarkWarm
// measure what that saves; the figures are in the README (Performance,
// internal/warm).
package warm

import (
	"sync"
	"sync/atomic"
	"time"
)

// Pool runs tasks on goroutines that wait up to a keep-alive for their next
// task before they end. It never queues a task: Go hands it to an idle
// goroutine if one is waiting, else starts one, so a slow task holds up no
// other. Its owner calls Close when it stops, so that no goroutine of the
// pool outlives it. The zero value is not usable; call New.
type Pool struct {
	idle chan func()
	keep time.Duration
	done chan struct{} // closed by Close: idle goroutines end at once

	mu     sync.Mutex // orders starting a goroutine (wg.Add) before Close's wait
	closed bool
	wg     sync.WaitGroup // the pool's goroutines

	// started and live count goroutines, for tests and curiosity.
	started, live atomic.Int64
}

// New returns a pool whose idle goroutines end after keep without a task.
func New(keep time.Duration) *Pool {
	return &Pool{idle: make(chan func()), keep: keep, done: make(chan struct{})}
}

// Go runs f on an idle goroutine of the pool, or on a new one. After Close,
// Go runs f itself, on the caller's goroutine, and returns when f has: a
// late task is neither dropped (its owner may be waiting for it) nor given a
// goroutine that would outlive Close.
func (p *Pool) Go(f func()) {
	select {
	case p.idle <- f:
		return
	default:
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		f()
		return
	}
	p.wg.Add(1)
	p.started.Add(1)
	p.live.Add(1)
	p.mu.Unlock()
	go p.loop(f)
}

// Close ends every idle goroutine at once and waits for the running tasks'
// goroutines to end, each after its task. It may be called more than once.
func (p *Pool) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.done)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Live is how many goroutines the pool holds, running a task or idle.
func (p *Pool) Live() int { return int(p.live.Load()) }

func (p *Pool) loop(f func()) {
	defer p.wg.Done()
	defer p.live.Add(-1)
	t := time.NewTimer(p.keep)
	defer t.Stop()
	for {
		f()
		f = nil // let the task's closure go while idle
		t.Reset(p.keep)
		select {
		case f = <-p.idle:
		case <-t.C:
			return
		case <-p.done:
			return
		}
	}
}
