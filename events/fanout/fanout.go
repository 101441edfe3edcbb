// Package fanout serves several followers of the log in one process from one
// reading of it. Each follower's Follow takes its events from a shared pump
// instead of a consumer of its own, so the server delivers every event once
// and the process decodes it once. A follower that starts behind the pump,
// or falls behind it (its queue full), reads from the source on its own
// until it has caught up and then joins again: a slow follower never holds
// up the others, and holds at most Queue events in memory.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/torpor/torpor/events"
)

// Source is the log the pump and the followers that are behind read
// (events.Store satisfies it).
type Source interface {
	Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error
}

// Defaults of New.
const (
	// PumpBatch bounds the events the pump takes from the source at once.
	PumpBatch = 1000
	// Queue is how many events may wait for one follower before it is sent
	// off to read on its own: the memory a slow follower may hold up.
	Queue = 16384
	// queueBatches bounds the batches waiting for one follower.
	queueBatches = 1024
)

var (
	// errBehind ends a follower's shared reading: its queue was full.
	errBehind = errors.New("fanout: follower fell behind the shared reading")
	// errJoin ends a follower's own reading: it caught up with the pump.
	errJoin = errors.New("fanout: follower caught up")
	// errStale ends a pump that is no longer the current one.
	errStale = errors.New("fanout: pump replaced")
)

// Log is the shared reading of a Source. Its Follow has the contract of
// events.Store.Follow.
type Log struct {
	src Source

	mu     sync.Mutex
	subs   map[*sub]struct{}
	pump   int                // id of the current pump, 0 when none runs
	pumped uint64             // the last sequence the current pump handed out
	stop   context.CancelFunc // ends the current pump
	pumps  int                // ids handed out
}

// sub is one follower on the shared reading.
type sub struct {
	ch     chan batch // closed when the follower is sent off; err says why
	err    error
	queued int // events in ch; Log.mu held
}

// batch is what one Follow call of the pump's handed over.
type batch struct {
	envs    []events.Envelope
	pending uint64
}

// New returns the shared reading of src.
func New(src Source) *Log {
	return &Log{src: src, subs: map[*sub]struct{}{}}
}

// Follow hands h every event above after, in order, up to max at a time,
// until ctx ends (nil) or h fails (its error). It reads from the shared pump
// when it can and from the source on its own while it is behind.
func (l *Log) Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error {
	if max < 1 {
		return fmt.Errorf("follow: batch size %d: want 1 or more", max)
	}
	pos := after
	for ctx.Err() == nil {
		s := l.join(pos)
		if s == nil {
			err := l.src.Follow(ctx, pos, max, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
				if err := h(ctx, envs, pending); err != nil {
					return err
				}
				pos = envs[len(envs)-1].Seq
				if l.caughtUp(pos) {
					return errJoin
				}
				return nil
			})
			if errors.Is(err, errJoin) {
				continue
			}
			return err
		}
		err := l.consume(ctx, s, &pos, max, h)
		l.leave(s)
		if errors.Is(err, errBehind) {
			continue
		}
		return err
	}
	return nil
}

// join puts a follower at pos on the shared reading and returns it, or nil
// when the pump is past pos or far behind it (the follower reads on its own
// first: it must not wait for a pump that is still catching up). With no
// pump running, it starts one at pos.
func (l *Log) join(pos uint64) *sub {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pump != 0 && !l.near(pos) {
		return nil
	}
	if l.pump == 0 {
		l.pumps++
		l.pump, l.pumped = l.pumps, pos
		ctx, stop := context.WithCancel(context.Background())
		l.stop = stop
		go l.run(ctx, l.pump, pos)
	}
	s := &sub{ch: make(chan batch, queueBatches)}
	l.subs[s] = struct{}{}
	return s
}

// caughtUp reports whether a follower that has read up to pos may join.
func (l *Log) caughtUp(pos uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pump == 0 || l.near(pos)
}

// near reports whether a follower at pos may join the running pump: it has
// nothing to miss (pos at or past the pump) and little to wait for (at most
// Queue events ahead). l.mu is held.
func (l *Log) near(pos uint64) bool {
	return pos >= l.pumped && pos-l.pumped <= Queue
}

// leave takes s off the shared reading; the last one to leave stops the
// pump.
func (l *Log) leave(s *sub) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.subs, s)
	if len(l.subs) == 0 && l.pump != 0 {
		l.stop()
		l.pump = 0
	}
}

// run is pump id: it reads the source from after and hands every batch to
// every follower on the shared reading, sending off those whose queue is
// full. When the source fails, every follower is sent off with its error.
func (l *Log) run(ctx context.Context, id int, after uint64) {
	err := l.src.Follow(ctx, after, PumpBatch, func(_ context.Context, envs []events.Envelope, pending uint64) error {
		b := batch{envs: slices.Clone(envs), pending: pending}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.pump != id {
			return errStale
		}
		l.pumped = b.envs[len(b.envs)-1].Seq
		for s := range l.subs {
			if s.queued+len(b.envs) > Queue {
				l.sendOff(s, errBehind)
				continue
			}
			select {
			case s.ch <- b:
				s.queued += len(b.envs)
			default:
				l.sendOff(s, errBehind)
			}
		}
		if len(l.subs) == 0 { // all sent off: the next to join starts afresh
			l.stop()
			l.pump = 0
			return errStale
		}
		return nil
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pump != id {
		return
	}
	if err == nil {
		err = errors.New("fanout: the shared reading ended")
	}
	for s := range l.subs {
		l.sendOff(s, err)
	}
	l.pump = 0
}

// sendOff ends s's shared reading with err. l.mu is held.
func (l *Log) sendOff(s *sub, err error) {
	s.err = err
	close(s.ch)
	delete(l.subs, s)
}

// consume hands the batches queued for s to h, each event once and in
// order, merging what is queued up to max events at a time, until ctx ends,
// h fails, or s is sent off.
func (l *Log) consume(ctx context.Context, s *sub, pos *uint64, max int, h events.FollowHandler) error {
	var envs []events.Envelope
	for {
		var b batch
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case b, ok = <-s.ch:
		}
		if !ok {
			return l.err(s)
		}
		envs = append(envs[:0], b.envs...)
		pending := b.pending
	more:
		for len(envs) < max {
			select {
			case b, ok = <-s.ch:
				if !ok {
					break more
				}
				envs = append(envs, b.envs...)
				pending = b.pending
			default:
				break more
			}
		}
		l.taken(s, len(envs))
		// Hand over what is new, max at a time; pending counts what
		// follows each part in the log.
		for i := 0; i < len(envs); {
			for i < len(envs) && envs[i].Seq <= *pos {
				i++
			}
			if i == len(envs) {
				break
			}
			j := min(i+max, len(envs))
			if err := h(ctx, envs[i:j], pending+uint64(len(envs)-j)); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			*pos, i = envs[j-1].Seq, j
		}
		if !ok {
			return l.err(s)
		}
	}
}

// taken notes that s took n events off its queue.
func (l *Log) taken(s *sub, n int) {
	l.mu.Lock()
	s.queued -= n
	l.mu.Unlock()
}

// err is why s was sent off.
func (l *Log) err(s *sub) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return s.err
}
