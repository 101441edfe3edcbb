package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/fanout"
	"github.com/torpor/torpor/events/memstore"
	"github.com/torpor/torpor/events/storetest"
)

const wait = 10 * time.Second

// shared is a memstore whose Follow is served by a fanout.Log, and that
// counts the follows running on the store itself.
type shared struct {
	*memstore.Store
	log  *fanout.Log
	src  *counting
	last map[string]uint64 // appendN's: each sandbox's last sequence
}

func (s shared) Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error {
	return s.log.Follow(ctx, after, max, h)
}

// counting is the Source under the Log: it counts the follows under way.
type counting struct {
	*memstore.Store
	mu     sync.Mutex
	active int
	calls  int
	fail   error // returned by every Follow when set
	// slowFirst, when set, is how long the first Follow's handler waits
	// before each batch: a pump that crawls.
	slowFirst time.Duration
}

func (c *counting) Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error {
	c.mu.Lock()
	c.active++
	c.calls++
	fail := c.fail
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.active--
		c.mu.Unlock()
	}()
	if fail != nil {
		return fail
	}
	c.mu.Lock()
	slow := c.calls == 1 && c.slowFirst > 0
	c.mu.Unlock()
	if slow {
		inner := h
		h = func(ctx context.Context, envs []events.Envelope, pending uint64) error {
			select {
			case <-time.After(c.slowFirst):
			case <-ctx.Done():
				return ctx.Err()
			}
			return inner(ctx, envs, pending)
		}
	}
	return c.Store.Follow(ctx, after, max, h)
}

func (c *counting) running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active
}

func newShared() shared {
	m := memstore.New()
	src := &counting{Store: m}
	return shared{Store: m, log: fanout.New(src), src: src, last: map[string]uint64{}}
}

// TestContract: a Log's Follow keeps the contract of events.Store.Follow.
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) events.Store { return newShared() })
}

// follower runs Follow in a goroutine and collects what it is handed.
type follower struct {
	mu    sync.Mutex
	seqs  []uint64
	dups  int
	block chan struct{} // while not nil and open, h waits on it
	done  chan error
	got   chan struct{} // a value after every batch
}

func follow(t *testing.T, s shared, after uint64, block chan struct{}) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{block: block, done: make(chan error, 1), got: make(chan struct{}, 1<<16)}
	go func() {
		f.done <- s.Follow(ctx, after, 100, func(ctx context.Context, envs []events.Envelope, _ uint64) error {
			if f.block != nil {
				select {
				case <-f.block:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			f.mu.Lock()
			for _, e := range envs {
				if n := len(f.seqs); n > 0 && e.Seq <= f.seqs[n-1] {
					f.dups++
					continue
				}
				f.seqs = append(f.seqs, e.Seq)
			}
			f.mu.Unlock()
			f.got <- struct{}{}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-f.done:
		case <-time.After(wait):
			t.Error("Follow did not return after its context ended")
		}
	})
	return f
}

// waitFor waits until f was handed every sequence from first to last, in
// order and once each.
func (f *follower) waitFor(t *testing.T, first, last uint64) {
	t.Helper()
	deadline := time.After(wait)
	for {
		f.mu.Lock()
		n := len(f.seqs)
		done := n > 0 && f.seqs[n-1] >= last
		f.mu.Unlock()
		if done {
			break
		}
		select {
		case <-f.got:
		case <-deadline:
			t.Fatalf("follower has %d events, want up to %d", n, last)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dups != 0 {
		t.Errorf("%d events handed twice", f.dups)
	}
	for i, seq := range f.seqs {
		if want := first + uint64(i); seq != want {
			t.Fatalf("event %d is seq %d, want %d (gap or disorder)", i, seq, want)
		}
	}
}

func appendN(t *testing.T, s shared, n int) uint64 {
	t.Helper()
	var last uint64
	for i := range n {
		id := fmt.Sprintf("0193b0a4-0000-7000-8000-00000000000%d", i%7)
		seq, err := s.Append(context.Background(), id, s.last[id], storetest.NewEnvelope(t, id, &events.Started{Generation: int64(i)}))
		if err != nil {
			t.Fatal(err)
		}
		s.last[id], last = seq, seq
	}
	return last
}

// TestOneReadingForTwoFollowers: two followers at the head share one follow
// of the source, and each gets every event once, in order.
func TestOneReadingForTwoFollowers(t *testing.T) {
	s := newShared()
	a, b := follow(t, s, 0, nil), follow(t, s, 0, nil)
	last := appendN(t, s, 500)
	a.waitFor(t, 1, last)
	b.waitFor(t, 1, last)
	if n := s.src.running(); n != 1 {
		t.Errorf("%d follows of the source under way, want the one shared", n)
	}
}

// TestLateFollowerCatchesUpAndJoins: a follower that starts behind reads
// the source on its own until it has caught up, then shares the reading.
func TestLateFollowerCatchesUpAndJoins(t *testing.T) {
	s := newShared()
	a := follow(t, s, 0, nil)
	first := appendN(t, s, 300)
	a.waitFor(t, 1, first)
	late := follow(t, s, 100, nil)
	late.waitFor(t, 101, first)
	last := appendN(t, s, 200)
	a.waitFor(t, 1, last)
	late.waitFor(t, 101, last)
	if n := s.src.running(); n != 1 {
		t.Errorf("%d follows of the source under way after catching up, want 1", n)
	}
}

// TestSlowFollowerHoldsUpNoOne: a follower whose handler is stuck does not
// stop the other; once unstuck it gets everything, in order and once.
func TestSlowFollowerHoldsUpNoOne(t *testing.T) {
	s := newShared()
	block := make(chan struct{})
	stuck := follow(t, s, 0, block)
	fast := follow(t, s, 0, nil)
	// More events than a queue holds.
	last := appendN(t, s, fanout.Queue+500)
	fast.waitFor(t, 1, last)
	close(block)
	stuck.waitFor(t, 1, last)
	more := appendN(t, s, 50)
	fast.waitFor(t, 1, more)
	stuck.waitFor(t, 1, more)
}

// TestHandlerErrorEndsOnlyItsFollower: h's error ends that Follow with it;
// the other follower goes on.
func TestHandlerErrorEndsOnlyItsFollower(t *testing.T) {
	s := newShared()
	boom := errors.New("boom")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- s.Follow(ctx, 0, 10, func(context.Context, []events.Envelope, uint64) error { return boom })
	}()
	other := follow(t, s, 0, nil)
	last := appendN(t, s, 20)
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("Follow = %v, want the handler's error", err)
		}
	case <-time.After(wait):
		t.Fatal("Follow did not return the handler's error")
	}
	other.waitFor(t, 1, last)
	more := appendN(t, s, 20)
	other.waitFor(t, 1, more)
}

// TestLastFollowerStopsTheReading: when every follower has gone, the shared
// follow of the source ends; a new follower starts it again.
func TestLastFollowerStopsTheReading(t *testing.T) {
	s := newShared()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.Follow(ctx, 0, 10, func(context.Context, []events.Envelope, uint64) error { return nil })
	}()
	appendN(t, s, 5)
	deadline := time.Now().Add(wait)
	for s.src.running() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the shared reading never started")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Follow = %v after cancel, want nil", err)
	}
	for s.src.running() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the shared reading goes on with no follower")
		}
		time.Sleep(time.Millisecond)
	}
	f := follow(t, s, 0, nil)
	last := appendN(t, s, 5)
	f.waitFor(t, 1, last)
}

// TestSourceErrorReachesTheFollower: when the source cannot be followed,
// Follow returns its error (the caller follows again later).
func TestSourceErrorReachesTheFollower(t *testing.T) {
	s := newShared()
	down := fmt.Errorf("follow: %w", events.ErrUnavailable)
	s.src.fail = down
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	err := s.Follow(ctx, 0, 10, func(context.Context, []events.Envelope, uint64) error { return nil })
	if !errors.Is(err, events.ErrUnavailable) {
		t.Fatalf("Follow = %v, want the source's error", err)
	}
	s.src.mu.Lock()
	s.src.fail = nil
	s.src.mu.Unlock()
	f := follow(t, s, 0, nil)
	last := appendN(t, s, 5)
	f.waitFor(t, 1, last)
}

// TestFollowerAheadDoesNotWaitForThePump: a follower far ahead of a pump
// that is still catching up reads on its own and sees new events at once.
func TestFollowerAheadDoesNotWaitForThePump(t *testing.T) {
	s := newShared()
	s.src.slowFirst = 200 * time.Millisecond // 17 batches: over 3 s behind
	backlog := appendN(t, s, fanout.Queue+1000)
	behind := follow(t, s, 0, nil) // starts the crawling pump at 0
	time.Sleep(50 * time.Millisecond)
	ahead := follow(t, s, backlog, nil)
	start := time.Now()
	last := appendN(t, s, 1)
	ahead.waitFor(t, backlog+1, last)
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("the follower ahead waited %s for a new event, behind the pump", waited)
	}
	behind.waitFor(t, 1, last)
}
