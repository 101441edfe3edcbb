package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// batch is one call of a FollowHandler, with its envelopes copied out.
type batch struct {
	envs    []events.Envelope
	pending uint64
}

// follower runs Follow in a goroutine until stop, sending every batch on
// batches.
type follower struct {
	cancel  context.CancelFunc
	done    chan error
	batches chan batch
	once    sync.Once
}

func follow(t *testing.T, s events.Store, after uint64, max int) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{cancel: cancel, done: make(chan error, 1), batches: make(chan batch, 1000)}
	go func() {
		f.done <- s.Follow(ctx, after, max, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
			select {
			case f.batches <- batch{slices.Clone(envs), pending}:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	t.Cleanup(func() { f.stop(t) })
	return f
}

// stop ends the follower and fails t unless Follow returns nil within
// Timeout; safe to call twice.
func (f *follower) stop(t *testing.T) {
	t.Helper()
	f.once.Do(func() {
		f.cancel()
		select {
		case err := <-f.done:
			if err != nil {
				t.Errorf("follow returned %v after cancel, want nil", err)
			}
		case <-time.After(Timeout):
			t.Errorf("follow did not return within %v of cancel", Timeout)
		}
	})
}

// receive waits for batches until they hold n events or more.
func (f *follower) receive(t *testing.T, n int) []batch {
	t.Helper()
	var got []batch
	total := 0
	timeout := time.After(Timeout)
	for total < n {
		select {
		case b := <-f.batches:
			got = append(got, b)
			total += len(b.envs)
		case err := <-f.done:
			t.Fatalf("follow returned %v after %d events, want %d", err, total, n)
		case <-timeout:
			t.Fatalf("got %d events in %v, want %d", total, Timeout, n)
		}
	}
	return got
}

// receiveHead waits for batches until one has pending 0.
func (f *follower) receiveHead(t *testing.T) []batch {
	t.Helper()
	var got []batch
	timeout := time.After(Timeout)
	for {
		select {
		case b := <-f.batches:
			got = append(got, b)
			if b.pending == 0 {
				return got
			}
		case err := <-f.done:
			t.Fatalf("follow returned %v before pending 0, want it running", err)
		case <-timeout:
			t.Fatalf("no batch with pending 0 in %v: %d batches", Timeout, len(got))
		}
	}
}

func flatten(batches []batch) []events.Envelope {
	var out []events.Envelope
	for _, b := range batches {
		out = append(out, b.envs...)
	}
	return out
}

// appendMixed appends n events spread over three sandboxes, some of them as
// atomic appends of several, and returns them in log order with Seq set.
func appendMixed(t *testing.T, s events.Store, n int) []events.Envelope {
	t.Helper()
	var out []events.Envelope
	last := map[string]uint64{}
	for len(out) < n {
		id := fmt.Sprintf("0193b0a4-0000-7000-8000-00000000000%d", len(out)%3)
		envs := []events.Envelope{started(t, id, int64(len(out)))}
		if len(out)%4 == 1 && len(out)+1 < n {
			envs = append(envs, started(t, id, int64(len(out)+1)))
		}
		last[id] = mustAppend(t, s, id, last[id], envs...)
		for i := range envs {
			envs[i].Seq = last[id] - uint64(len(envs)-1-i)
		}
		out = append(out, envs...)
	}
	return out
}

func testFollowOrder(t *testing.T, s events.Store) {
	want := appendMixed(t, s, 12)
	f := follow(t, s, 0, 100)
	got := flatten(f.receive(t, len(want)))
	if !equalIDs(ids(got), ids(want)) {
		t.Fatalf("delivered: got %v, want %v", ids(got), ids(want))
	}
	for i := range got {
		sameEnvelope(t, got[i], want[i], want[i].Seq)
	}
}

func testFollowAfter(t *testing.T, s events.Store) {
	all := appendMixed(t, s, 5)
	t.Run("after the third", func(t *testing.T) {
		after := all[2].Seq
		got := flatten(follow(t, s, after, 10).receive(t, 2))
		if want := ids(all[3:]); !equalIDs(ids(got), want) {
			t.Errorf("delivered: got %v, want %v", ids(got), want)
		}
		for _, e := range got {
			if e.Seq <= after {
				t.Errorf("event %s at %d, not after %d", e.ID, e.Seq, after)
			}
		}
	})
	t.Run("after the last", func(t *testing.T) {
		f := follow(t, s, all[4].Seq, 10)
		late := created(t, sbxLate)
		seq := mustAppend(t, s, sbxLate, 0, late)
		got := flatten(f.receive(t, 1))
		if !equalIDs(ids(got), []string{late.ID}) {
			t.Fatalf("delivered: got %v, want only the event appended later", ids(got))
		}
		sameEnvelope(t, got[0], late, seq)
	})
}

func testFollowMax(t *testing.T, s events.Store) {
	const n, max = 10, 3
	all := appendMixed(t, s, n)
	batches := follow(t, s, 0, max).receive(t, n)
	k := 0 // events delivered so far
	for i, b := range batches {
		if len(b.envs) == 0 || len(b.envs) > max {
			t.Errorf("batch %d: %d events, want 1 to %d", i, len(b.envs), max)
		}
		for _, e := range b.envs {
			if k >= n || e.Seq != all[k].Seq {
				t.Fatalf("batch %d: event at %d, want the next of the log after %d delivered", i, e.Seq, k)
			}
			k++
		}
		// The log does not move: pending is what follows the batch in it.
		if want := uint64(n - k); b.pending != want {
			t.Errorf("batch %d ending at %d: pending %d, want %d", i, all[k-1].Seq, b.pending, want)
		}
	}
	if k != n {
		t.Errorf("delivered %d events, want %d", k, n)
	}
}

func testFollowLive(t *testing.T, s events.Store) {
	before := appendMixed(t, s, 3)
	f := follow(t, s, 0, 10)
	if got := flatten(f.receiveHead(t)); !equalIDs(ids(got), ids(before)) {
		t.Fatalf("up to the head: got %v, want %v", ids(got), ids(before))
	}

	e1 := created(t, sbxLive)
	s1 := mustAppend(t, s, sbxLive, 0, e1)
	b := f.receive(t, 1)
	if len(b) != 1 || len(b[0].envs) != 1 || b[0].pending != 0 {
		t.Fatalf("after one append: got %d batches, first of %d events with pending %d; want one event, pending 0",
			len(b), len(b[0].envs), b[0].pending)
	}
	sameEnvelope(t, b[0].envs[0], e1, s1)

	e2, e3 := started(t, sbxLive, 1), started(t, sbxLive, 2)
	s3 := mustAppend(t, s, sbxLive, s1, e2, e3)
	bs := f.receive(t, 2)
	got := flatten(bs)
	if !equalIDs(ids(got), []string{e2.ID, e3.ID}) {
		t.Fatalf("after two appends: got %v, want e2, e3", ids(got))
	}
	sameEnvelope(t, got[1], e3, s3)
	if last := bs[len(bs)-1]; last.pending != 0 {
		t.Errorf("batch ending at the head: pending %d, want 0", last.pending)
	}
}

func testFollowHandlerError(t *testing.T, s events.Store) {
	all := appendMixed(t, s, 6)
	boom := errors.New("boom")
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	var handled uint64 // the last seq of a batch h took
	err := s.Follow(ctx, 0, 2, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
		for _, e := range envs {
			if e.ID == all[3].ID {
				return boom
			}
		}
		handled = envs[len(envs)-1].Seq
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("follow: got %v, want the handler's error", err)
	}
	if handled < all[1].Seq || handled >= all[3].Seq {
		t.Fatalf("handled up to %d, want from %d to below %d", handled, all[1].Seq, all[3].Seq)
	}

	k := slices.IndexFunc(all, func(e events.Envelope) bool { return e.Seq > handled })
	got := flatten(follow(t, s, handled, 2).receive(t, len(all)-k))
	if want := ids(all[k:]); !equalIDs(ids(got), want) {
		t.Errorf("following again after %d: got %v, want %v", handled, ids(got), want)
	}
}

func testFollowCancel(t *testing.T, s events.Store) {
	t.Run("on an empty log", func(t *testing.T) {
		follow(t, s, 0, 10).stop(t)
	})
	t.Run("at the head", func(t *testing.T) {
		appendMixed(t, s, 3)
		f := follow(t, s, 0, 10)
		f.receiveHead(t)
		f.stop(t)
	})
	t.Run("while the handler runs", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		running := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- s.Follow(ctx, 0, 10, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
				close(running)
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		select {
		case <-running:
		case err := <-done:
			t.Fatalf("follow returned %v before calling the handler", err)
		case <-time.After(Timeout):
			t.Fatalf("no batch in %v", Timeout)
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("follow returned %v, want nil", err)
			}
		case <-time.After(Timeout):
			t.Fatalf("follow did not return within %v of cancel", Timeout)
		}
	})
}

func testFollowKeep(t *testing.T, s events.Store) {
	const n = 10
	want := appendMixed(t, s, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var kept []events.Envelope // only h touches it until Follow returns
	done := make(chan error, 1)
	go func() {
		done <- s.Follow(ctx, 0, 3, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
			kept = append(kept, envs...)
			if len(kept) >= n {
				cancel()
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
	case <-time.After(Timeout):
		t.Fatalf("follow did not deliver %d events in %v", n, Timeout)
	}
	if len(kept) != n {
		t.Fatalf("kept %d events, want %d", len(kept), n)
	}
	for i := range kept {
		sameEnvelope(t, kept[i], want[i], want[i].Seq)
	}
}

func testFollowBadMax(t *testing.T, s events.Store) {
	appendMixed(t, s, 2)
	for _, max := range []int{0, -1} {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		called := false
		err := s.Follow(ctx, 0, max, func(context.Context, []events.Envelope, uint64) error {
			called = true
			return nil
		})
		cancel()
		if err == nil || called {
			t.Errorf("follow with max %d: got %v, handler called %v; want an error and no call", max, err, called)
		}
	}
}
