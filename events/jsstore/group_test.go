package jsstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/events/storetest"
)

// groupStore is a store with group commit on a server that syncs every
// write, as serve --fsync always runs it.
func groupStore(t *testing.T) *jsstore.Store {
	t.Helper()
	srv := natstest.StartWith(t, natstest.Options{SyncAlways: true})
	s, err := jsstore.New(context.Background(), srv.JS, jsstore.Config{GroupCommit: true})
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	return s
}

func sandbox(i int) string { return fmt.Sprintf("0193b0a4-0000-7000-8000-%012d", i) }

type appended struct {
	seq uint64
	err error
}

// appendAll runs the appends of calls at once while s's group is held, and
// releases it once all of them wait in its queue: they go as one group.
func appendAll(t *testing.T, s *jsstore.Store, calls []func() (uint64, error)) []appended {
	t.Helper()
	queued, release := jsstore.HoldGroup(s)
	got := make([]appended, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() {
			seq, err := call()
			got[i] = appended{seq, err}
		})
	}
	for n := 0; n < len(calls); n = <-queued {
	}
	release()
	wg.Wait()
	return got
}

// checkAt checks that the message at seq is env on its sandbox's subject.
func checkAt(t *testing.T, s *jsstore.Store, seq uint64, env events.Envelope) {
	t.Helper()
	msg, err := s.Stream().GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatalf("get %d: %v", seq, err)
	}
	if msg.Subject != jsstore.Subject(env.SandboxID) || msg.Header.Get(jetstream.MsgIDHeader) != env.ID {
		t.Errorf("at %d: %s %s, want %s %s", seq, msg.Subject, msg.Header.Get(jetstream.MsgIDHeader), jsstore.Subject(env.SandboxID), env.ID)
	}
}

func TestGroupCommitContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) events.Store { return groupStore(t) })
}

// TestGroupCommitOneSubjectTwoWriters: two writers decide on one sandbox at
// the same last sequence, and their appends wait for the same group (with
// others, so that the group is a batch): exactly one lands, the other gets
// ErrConflict, as it would alone, and re-decides.
func TestGroupCommitOneSubjectTwoWriters(t *testing.T) {
	s := groupStore(t)
	ctx := context.Background()
	base, err := s.Append(ctx, sandbox(1), 0, envelope(t, sandbox(1), 1))
	if err != nil {
		t.Fatal(err)
	}
	a, b := envelope(t, sandbox(1), 2), envelope(t, sandbox(1), 3)
	others := []events.Envelope{envelope(t, sandbox(2), 1), envelope(t, sandbox(3), 1)}
	got := appendAll(t, s, []func() (uint64, error){
		func() (uint64, error) { return s.Append(ctx, sandbox(1), base, a) },
		func() (uint64, error) { return s.Append(ctx, sandbox(1), base, b) },
		func() (uint64, error) { return s.Append(ctx, sandbox(2), 0, others[0]) },
		func() (uint64, error) { return s.Append(ctx, sandbox(3), 0, others[1]) },
	})
	won, lost := 0, 0
	for i, r := range got[:2] {
		switch {
		case r.err == nil:
			won++
			checkAt(t, s, r.seq, []events.Envelope{a, b}[i])
		case errors.Is(r.err, events.ErrConflict):
			lost++
		default:
			t.Errorf("writer %d: %v, want success or ErrConflict", i, r.err)
		}
	}
	if won != 1 || lost != 1 {
		t.Errorf("the two writers on one sandbox: %d won, %d in conflict, want 1 and 1", won, lost)
	}
	for i, r := range got[2:] {
		if r.err != nil {
			t.Fatalf("append on another sandbox: %v", r.err)
		}
		checkAt(t, s, r.seq, others[i])
	}
	if batches, _ := jsstore.Batched(s); batches == 0 {
		t.Errorf("no batch landed: the group went each on its own")
	}
	if n := msgCount(t, s); n != 4 {
		t.Errorf("messages in stream: %d, want 4", n)
	}
}

// TestGroupCommitManySubjects: writers on sandboxes of their own, each
// appending in turn (every third two events at a time, which must land
// together), their appends grouped in batches: every event lands at the
// sequence its append answered, in each sandbox's order.
func TestGroupCommitManySubjects(t *testing.T) {
	const writers, rounds = 24, 6
	s := groupStore(t)
	ctx := context.Background()
	envs := make([][][]events.Envelope, writers) // by writer, round
	for w := range writers {
		g := int64(0)
		for range rounds {
			var round []events.Envelope
			for range 1 + min(1, w%3) {
				g++
				round = append(round, envelope(t, sandbox(w), g))
			}
			envs[w] = append(envs[w], round)
		}
	}
	seqs := make([][]uint64, writers)
	calls := make([]func() (uint64, error), writers)
	for w := range writers {
		calls[w] = func() (uint64, error) {
			// The first round waits in the held group; the rest follow
			// as each answer comes.
			var last uint64
			for r := range rounds {
				seq, err := s.Append(ctx, sandbox(w), last, envs[w][r]...)
				if err != nil {
					return 0, fmt.Errorf("round %d: %w", r, err)
				}
				seqs[w] = append(seqs[w], seq)
				last = seq
			}
			return last, nil
		}
	}
	for w, r := range appendAll(t, s, calls) {
		if r.err != nil {
			t.Fatalf("writer %d: %v", w, r.err)
		}
	}
	total := 0
	for w := range writers {
		for r, seq := range seqs[w] {
			round := envs[w][r]
			first := seq - uint64(len(round)) + 1
			if r > 0 && first <= seqs[w][r-1] {
				t.Errorf("writer %d: round %d from %d, after round %d at %d", w, r, first, r-1, seqs[w][r-1])
			}
			for i, env := range round {
				checkAt(t, s, first+uint64(i), env)
			}
			total += len(round)
		}
	}
	if n := msgCount(t, s); n != uint64(total) {
		t.Errorf("messages in stream: %d, want %d", n, total)
	}
	if batches, _ := jsstore.Batched(s); batches == 0 {
		t.Errorf("no batch landed: the appends went each on its own")
	}
}

// TestGroupCommitOneMemberInConflict: a group whose one member's expected
// sequence is stale is refused as a batch; that member gets ErrConflict,
// the others land, a multi-event append among them in one piece.
func TestGroupCommitOneMemberInConflict(t *testing.T) {
	s := groupStore(t)
	ctx := context.Background()
	first, err := s.Append(ctx, sandbox(1), 0, envelope(t, sandbox(1), 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, sandbox(1), first, envelope(t, sandbox(1), 2)); err != nil {
		t.Fatal(err)
	}
	stale := envelope(t, sandbox(1), 3)
	b := envelope(t, sandbox(2), 1)
	c := []events.Envelope{envelope(t, sandbox(3), 1), envelope(t, sandbox(3), 2)}
	got := appendAll(t, s, []func() (uint64, error){
		func() (uint64, error) { return s.Append(ctx, sandbox(2), 0, b) },
		func() (uint64, error) { return s.Append(ctx, sandbox(1), first, stale) },
		func() (uint64, error) { return s.Append(ctx, sandbox(3), 0, c...) },
	})
	if !errors.Is(got[1].err, events.ErrConflict) {
		t.Errorf("the stale member: %d, %v, want ErrConflict", got[1].seq, got[1].err)
	}
	if got[0].err != nil || got[2].err != nil {
		t.Fatalf("the others: %v, %v, want both landed", got[0].err, got[2].err)
	}
	checkAt(t, s, got[0].seq, b)
	checkAt(t, s, got[2].seq-1, c[0])
	checkAt(t, s, got[2].seq, c[1])
	if n := msgCount(t, s); n != 5 {
		t.Errorf("messages in stream: %d, want 5", n)
	}
}

// TestNoGroupCommitWithout: a store without GroupCommit (serve --fsync
// interval) appends at once even while its group is held: nothing waits,
// nothing is batched.
func TestNoGroupCommitWithout(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	queued, release := jsstore.HoldGroup(s)
	defer release()
	env := envelope(t, sandbox(1), 1)
	done := make(chan error, 1)
	go func() {
		_, err := s.Append(context.Background(), sandbox(1), 0, env)
		done <- err
	}()
	select {
	case n := <-queued:
		t.Fatalf("the append waits in a group (%d queued)", n)
	case err := <-done:
		if err != nil {
			t.Fatalf("append: %v", err)
		}
	}
	if batches, _ := jsstore.Batched(s); batches != 0 {
		t.Errorf("%d batches without group commit", batches)
	}
}

// TestGroupCommitEndedWhileQueued: an append whose context ends while it
// waits for its group is not sent, and answers as a single append whose
// publish never went: a retry of an append that landed gets its sequence,
// one that did not land ErrUnavailable (retry as is); the rest of the
// group lands.
func TestGroupCommitEndedWhileQueued(t *testing.T) {
	s := groupStore(t)
	ctx := context.Background()
	landed := envelope(t, sandbox(1), 1)
	seq, err := s.Append(ctx, sandbox(1), 0, landed)
	if err != nil {
		t.Fatal(err)
	}
	fresh, other := envelope(t, sandbox(2), 1), envelope(t, sandbox(3), 1)
	ending, end := context.WithCancel(ctx)
	queued, release := jsstore.HoldGroup(s)
	got := make([]appended, 3)
	var wg sync.WaitGroup
	for i, call := range []func() (uint64, error){
		func() (uint64, error) { return s.Append(ending, sandbox(1), 0, landed) },
		func() (uint64, error) { return s.Append(ending, sandbox(2), 0, fresh) },
		func() (uint64, error) { return s.Append(ctx, sandbox(3), 0, other) },
	} {
		wg.Go(func() {
			seq, err := call()
			got[i] = appended{seq, err}
		})
	}
	for n := 0; n < 3; n = <-queued {
	}
	end()
	release()
	wg.Wait()
	if got[0].err != nil || got[0].seq != seq {
		t.Errorf("the retry that landed: %d, %v, want %d, nil", got[0].seq, got[0].err, seq)
	}
	if !errors.Is(got[1].err, events.ErrUnavailable) {
		t.Errorf("the append that did not land: %d, %v, want ErrUnavailable", got[1].seq, got[1].err)
	}
	if got[2].err != nil {
		t.Fatalf("the other: %v", got[2].err)
	}
	checkAt(t, s, got[2].seq, other)
	if n := msgCount(t, s); n != 2 {
		t.Errorf("messages in stream: %d, want 2", n)
	}
}
