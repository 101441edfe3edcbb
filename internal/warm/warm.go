// Package warm runs short tasks each on a goroutine of its own, reusing
// goroutines that finished a task a moment ago. A new goroutine starts on a
// small stack and grows it, copying, the first time a task calls deep (JSON,
// a NATS request): for the saga steps and bus commands of torpor, one
// goroutine per task spent about 6% of the service's CPU in stack growth.
// A goroutine kept warm has its stack grown already.
package warm

import (
	"sync/atomic"
	"time"
)

// Pool runs tasks on goroutines that wait up to a keep-alive for their next
// task before they end. It never queues a task: Go hands it to an idle
// goroutine if one is waiting, else starts one, so a slow task holds up no
// other. The zero value is not usable; call New.
type Pool struct {
	idle chan func()
	keep time.Duration
	// started and live count goroutines, for tests and curiosity.
	started, live atomic.Int64
}

// New returns a pool whose idle goroutines end after keep without a task.
func New(keep time.Duration) *Pool {
	return &Pool{idle: make(chan func()), keep: keep}
}

// Go runs f on an idle goroutine of the pool, or on a new one.
func (p *Pool) Go(f func()) {
	select {
	case p.idle <- f:
	default:
		p.started.Add(1)
		p.live.Add(1)
		go p.loop(f)
	}
}

func (p *Pool) loop(f func()) {
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
		}
	}
}
