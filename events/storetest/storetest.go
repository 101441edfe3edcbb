// Package storetest is the contract suite of events.Store: every
// implementation (in memory, JetStream) runs Run and so behaves the same for
// appends under concurrency, retries, loads and followers.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
)

// Timeout bounds every wait of the suite for an event to arrive.
const Timeout = 10 * time.Second

// Run runs the contract suite; newStore returns a fresh, empty store per
// subtest and cleans it up with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) events.Store) {
	t.Helper()
	tests := []struct {
		name string
		run  func(t *testing.T, s events.Store)
	}{
		{"append to a new sandbox round-trips every field", testAppendNew},
		{"append with a wrong expected sequence conflicts and stores nothing", testWrongExpected},
		{"append expecting no events conflicts when there are some", testExpectedZeroOnExisting},
		{"append of several events is atomic and contiguous", testAppendMany},
		{"append of several events with a wrong expected sequence stores none", testAppendManyConflict},
		{"retried append that landed returns the same sequence", testRetryLanded},
		{"retried append of several events that landed returns the same sequence", testRetryLandedMany},
		{"concurrent appends: one wins, retries land exactly once", testConcurrentAppends},
		{"append rejects an empty append, a foreign envelope and a bad id", testAppendRejects},
		{"load returns only events after the given sequence", testLoadAfter},
		{"load of an unknown sandbox is empty", testLoadUnknown},
		{"load returns only that sandbox's events", testLoadIsolated},
		{"last sequence follows appends", testLastSeq},
		{"head is the last sequence of one sandbox's subject", testHead},
		{"an event of an unknown type is stored, left out by every reader, and counted by Head", testUnknownType},
		{"follow delivers every sandbox's events in stream order", testFollowOrder},
		{"follow starts after the given sequence", testFollowAfter},
		{"follow hands no batch larger than max, pending counts the events after it", testFollowMax},
		{"follow reaches the head with pending 0, then delivers appends live", testFollowLive},
		{"follow ends with the handler's error, following again resumes", testFollowHandlerError},
		{"follow returns nil when its context ends", testFollowCancel},
		{"follow lets the handler keep the envelopes", testFollowKeep},
		{"follow refuses a batch size below 1", testFollowBadMax},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newStore(t))
		})
	}
}

// NewEnvelope builds an envelope of e for sandbox id with every metadata
// field set, failing t on error.
func NewEnvelope(t testing.TB, id string, e events.Event) events.Envelope {
	t.Helper()
	env, err := events.NewEnvelope(id, e, events.Meta{
		Actor:         "storetest",
		CommandID:     uuid.NewString(),
		CorrelationID: uuid.NewString(),
		CausationID:   uuid.NewString(),
	}, time.Now())
	if err != nil {
		t.Fatalf("new envelope: %v", err)
	}
	env.Phase = events.PhaseProvisioning
	return env
}

// created is a sandbox.created envelope for id.
func created(t testing.TB, id string) events.Envelope {
	t.Helper()
	return NewEnvelope(t, id, &events.Created{
		Name: "name-" + id, Driver: "sim", Node: "node-1", Generation: 1,
		Command: []string{"sleep", "infinity"}, Labels: map[string]string{"team": "a"},
	})
}

// started is a sandbox.started envelope for id at generation g.
func started(t testing.TB, id string, g int64) events.Envelope {
	t.Helper()
	env := NewEnvelope(t, id, &events.Started{Generation: g, CredentialHash: fmt.Sprintf("hash-%d", g)})
	env.Phase = events.PhaseReady
	return env
}

// mustAppend appends and fails t on error.
func mustAppend(t testing.TB, s events.Store, id string, expected uint64, envs ...events.Envelope) uint64 {
	t.Helper()
	seq, err := s.Append(context.Background(), id, expected, envs...)
	if err != nil {
		t.Fatalf("append %s expected %d: %v", id, expected, err)
	}
	return seq
}

// mustLoad loads and fails t on error.
func mustLoad(t testing.TB, s events.Store, id string, after uint64) []events.Envelope {
	t.Helper()
	envs, err := s.Load(context.Background(), id, after)
	if err != nil {
		t.Fatalf("load %s after %d: %v", id, after, err)
	}
	return envs
}

// sameEnvelope fails t unless got is want as stored at seq.
func sameEnvelope(t testing.TB, got, want events.Envelope, seq uint64) {
	t.Helper()
	if got.Seq != seq {
		t.Errorf("seq: got %d, want %d", got.Seq, seq)
	}
	if got.MsgID != want.DedupID() {
		t.Errorf("msg id: got %q, want %q", got.MsgID, want.DedupID())
	}
	if !got.Time.Equal(want.Time) {
		t.Errorf("time: got %v, want %v", got.Time, want.Time)
	}
	if !bytes.Equal(got.Data, want.Data) {
		t.Errorf("data: got %s, want %s", got.Data, want.Data)
	}
	type fields struct {
		ID, SandboxID, Type                          string
		Schema                                       int
		Actor, CommandID, CorrelationID, CausationID string
		Phase                                        events.Phase
	}
	g := fields{got.ID, got.SandboxID, got.Type, got.Schema, got.Actor, got.CommandID, got.CorrelationID, got.CausationID, got.Phase}
	w := fields{want.ID, want.SandboxID, want.Type, want.Schema, want.Actor, want.CommandID, want.CorrelationID, want.CausationID, want.Phase}
	if g != w {
		t.Errorf("fields:\n got %+v\nwant %+v", g, w)
	}
}

// ids lists the event ids of envs.
func ids(envs []events.Envelope) []string {
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = e.ID
	}
	return out
}

func equalIDs(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

func testAppendNew(t *testing.T, s events.Store) {
	want := created(t, sbx1)
	seq, err := s.Append(context.Background(), sbx1, 0, want)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	if seq == 0 {
		t.Fatal("append returned sequence 0")
	}
	got := mustLoad(t, s, sbx1, 0)
	if len(got) != 1 {
		t.Fatalf("load: got %d events, want 1", len(got))
	}
	sameEnvelope(t, got[0], want, seq)
	e, err := got[0].Decode()
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if c, ok := e.(*events.Created); !ok || c.Name != "name-"+sbx1 || c.Labels["team"] != "a" {
		t.Errorf("decoded: got %#v", e)
	}
}

func testWrongExpected(t *testing.T, s events.Store) {
	first := mustAppend(t, s, sbx1, 0, created(t, sbx1))
	for _, expected := range []uint64{first + 1, first + 100} {
		_, err := s.Append(context.Background(), sbx1, expected, started(t, sbx1, 1))
		if !errors.Is(err, events.ErrConflict) {
			t.Errorf("append expected %d: got %v, want ErrConflict", expected, err)
		}
	}
	if got := mustLoad(t, s, sbx1, 0); len(got) != 1 {
		t.Errorf("load: got %d events, want 1", len(got))
	}
}

func testExpectedZeroOnExisting(t *testing.T, s events.Store) {
	mustAppend(t, s, sbx1, 0, created(t, sbx1))
	_, err := s.Append(context.Background(), sbx1, 0, created(t, sbx1))
	if !errors.Is(err, events.ErrConflict) {
		t.Fatalf("append expected 0: got %v, want ErrConflict", err)
	}
	if got := mustLoad(t, s, sbx1, 0); len(got) != 1 {
		t.Errorf("load: got %d events, want 1", len(got))
	}
}

func testAppendMany(t *testing.T, s events.Store) {
	first := mustAppend(t, s, sbx1, 0, created(t, sbx1))
	mustAppend(t, s, sbxOther, 0, created(t, sbxOther))
	load := mustLoad(t, s, sbx1, 0)
	expected := load[len(load)-1].Seq
	if expected != first {
		t.Fatalf("last of sbx1: got %d, want %d", expected, first)
	}
	batch := []events.Envelope{started(t, sbx1, 1), started(t, sbx1, 2), started(t, sbx1, 3)}
	last := mustAppend(t, s, sbx1, expected, batch...)
	got := mustLoad(t, s, sbx1, expected)
	if len(got) != len(batch) {
		t.Fatalf("load: got %d events, want %d", len(got), len(batch))
	}
	for i := range got {
		sameEnvelope(t, got[i], batch[i], last-uint64(len(batch)-1-i))
	}
}

func testAppendManyConflict(t *testing.T, s events.Store) {
	first := mustAppend(t, s, sbx1, 0, created(t, sbx1))
	batch := []events.Envelope{started(t, sbx1, 1), started(t, sbx1, 2), started(t, sbx1, 3)}
	_, err := s.Append(context.Background(), sbx1, first+1, batch...)
	if !errors.Is(err, events.ErrConflict) {
		t.Fatalf("append: got %v, want ErrConflict", err)
	}
	if got := mustLoad(t, s, sbx1, 0); len(got) != 1 {
		t.Errorf("load: got %d events, want 1", len(got))
	}
	// The rejected batch leaves no trace: it can be appended at the right place.
	last := mustAppend(t, s, sbx1, first, batch...)
	if got := mustLoad(t, s, sbx1, first); len(got) != 3 || got[2].Seq != last {
		t.Errorf("load after retry: got %d events ending at %d, want 3 ending at %d", len(got), got[len(got)-1].Seq, last)
	}
}

func testRetryLanded(t *testing.T, s events.Store) {
	first := mustAppend(t, s, sbx1, 0, created(t, sbx1))
	env := started(t, sbx1, 1)
	seq := mustAppend(t, s, sbx1, first, env)
	again, err := s.Append(context.Background(), sbx1, first, env)
	if err != nil {
		t.Fatalf("retry: got %v, want success", err)
	}
	if again != seq {
		t.Errorf("retry seq: got %d, want %d", again, seq)
	}
	got := mustLoad(t, s, sbx1, 0)
	if want := []string{ids(got)[0], env.ID}; !equalIDs(ids(got), want) {
		t.Errorf("log: got %v, want %v", ids(got), want)
	}
	last, err := s.LastSeq(context.Background())
	if err != nil || last != seq {
		t.Errorf("last seq: got %d, %v, want %d", last, err, seq)
	}
}

func testRetryLandedMany(t *testing.T, s events.Store) {
	ctx := context.Background()
	base := mustAppend(t, s, sbx2, 0, created(t, sbx2))
	tests := []struct {
		name     string
		id       string
		expected uint64
	}{
		{"on a new sandbox", sbx1, 0},
		{"after earlier events", sbx2, base},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			batch := []events.Envelope{started(t, tc.id, 1), started(t, tc.id, 2), started(t, tc.id, 3)}
			seq := mustAppend(t, s, tc.id, tc.expected, batch...)
			again, err := s.Append(ctx, tc.id, tc.expected, batch...)
			if err != nil {
				t.Fatalf("retry: got %v, want success", err)
			}
			if again != seq {
				t.Errorf("retry seq: got %d, want %d", again, seq)
			}
			if got := mustLoad(t, s, tc.id, tc.expected); !equalIDs(ids(got), ids(batch)) {
				t.Errorf("log: got %v, want %v", ids(got), ids(batch))
			}
			if last, err := s.LastSeq(ctx); err != nil || last != seq {
				t.Errorf("last seq: got %d, %v, want %d", last, err, seq)
			}
		})
	}
}

func testConcurrentAppends(t *testing.T, s events.Store) {
	const n = 8
	base := mustAppend(t, s, sbx1, 0, created(t, sbx1))
	envs := make([]events.Envelope, n)
	for i := range envs {
		envs[i] = started(t, sbx1, int64(i+1))
	}
	ctx := context.Background()
	errs := make([]error, n)
	// Every goroutine loads before any appends: they all expect the base.
	var wg, loaded sync.WaitGroup
	start := make(chan struct{})
	loaded.Add(n)
	for i := range n {
		wg.Go(func() {
			log, err := s.Load(ctx, sbx1, 0)
			loaded.Done()
			if err != nil {
				errs[i] = err
				return
			}
			expected := log[len(log)-1].Seq
			<-start
			_, errs[i] = s.Append(ctx, sbx1, expected, envs[i])
		})
	}
	loaded.Wait()
	close(start)
	wg.Wait()
	var won, lost int
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, events.ErrConflict):
			lost++
		default:
			t.Errorf("append %d: %v", i, err)
		}
	}
	if won != 1 || lost != n-1 {
		t.Fatalf("first round: got %d won, %d conflicts, want 1 and %d", won, lost, n-1)
	}

	for i := range n {
		if errs[i] == nil {
			continue
		}
		wg.Go(func() {
			for attempt := 0; attempt < 10*n; attempt++ {
				loaded, err := s.Load(ctx, sbx1, 0)
				if err != nil {
					errs[i] = err
					return
				}
				_, errs[i] = s.Append(ctx, sbx1, loaded[len(loaded)-1].Seq, envs[i])
				if !errors.Is(errs[i], events.ErrConflict) {
					return
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("retry %d: %v", i, err)
		}
	}
	got := mustLoad(t, s, sbx1, base)
	count := map[string]int{}
	for _, e := range got {
		count[e.ID]++
	}
	for i, e := range envs {
		if count[e.ID] != 1 {
			t.Errorf("event %d stored %d times, want once", i, count[e.ID])
		}
	}
	if len(got) != n {
		t.Errorf("log after base: got %d events, want %d", len(got), n)
	}
}

func testAppendRejects(t *testing.T, s events.Store) {
	ctx := context.Background()
	if _, err := s.Append(ctx, sbx1, 0); err == nil {
		t.Error("append of no events: got nil error")
	}
	if _, err := s.Append(ctx, sbx1, 0, created(t, "other")); err == nil {
		t.Error("append of another sandbox's event: got nil error")
	}
	for _, id := range []string{"", "a.b", "a*", "a>", "a b"} {
		if _, err := s.Append(ctx, id, 0, created(t, id)); err == nil {
			t.Errorf("append to sandbox id %q: got nil error", id)
		}
	}
	if got := mustLoad(t, s, sbx1, 0); len(got) != 0 {
		t.Errorf("load sbx1: got %d events, want 0", len(got))
	}
	if got := mustLoad(t, s, "other", 0); len(got) != 0 {
		t.Errorf("load other: got %d events, want 0", len(got))
	}
}

func testLoadAfter(t *testing.T, s events.Store) {
	e1, e2, e3 := created(t, sbx1), started(t, sbx1, 1), started(t, sbx1, 2)
	s1 := mustAppend(t, s, sbx1, 0, e1)
	s2 := mustAppend(t, s, sbx1, s1, e2)
	s3 := mustAppend(t, s, sbx1, s2, e3)
	tests := []struct {
		name  string
		after uint64
		want  []string
	}{
		{"from the start", 0, []string{e1.ID, e2.ID, e3.ID}},
		{"after the first", s1, []string{e2.ID, e3.ID}},
		{"after the second", s2, []string{e3.ID}},
		{"after the last", s3, nil},
		{"far beyond", s3 + 1000, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := mustLoad(t, s, sbx1, tc.after)
			if !equalIDs(ids(got), tc.want) {
				t.Errorf("got %v, want %v", ids(got), tc.want)
			}
			for _, e := range got {
				if e.Seq <= tc.after {
					t.Errorf("event %s at %d, not after %d", e.ID, e.Seq, tc.after)
				}
			}
		})
	}
}

func testLoadUnknown(t *testing.T, s events.Store) {
	mustAppend(t, s, sbx1, 0, created(t, sbx1))
	got, err := s.Load(context.Background(), "nobody", 0)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if len(got) != 0 {
		t.Errorf("load: got %d events, want 0", len(got))
	}
}

func testLoadIsolated(t *testing.T, s events.Store) {
	a1 := mustAppend(t, s, sbx1, 0, created(t, sbx1))
	b1 := mustAppend(t, s, sbx10, 0, created(t, sbx10))
	mustAppend(t, s, sbx1, a1, started(t, sbx1, 1))
	mustAppend(t, s, sbx10, b1, started(t, sbx10, 1))
	for _, id := range []string{sbx1, sbx10} {
		got := mustLoad(t, s, id, 0)
		if len(got) != 2 {
			t.Errorf("load %s: got %d events, want 2", id, len(got))
		}
		for _, e := range got {
			if e.SandboxID != id {
				t.Errorf("load %s: got an event of %s", id, e.SandboxID)
			}
		}
	}
}

func testLastSeq(t *testing.T, s events.Store) {
	ctx := context.Background()
	if got, err := s.LastSeq(ctx); err != nil || got != 0 {
		t.Fatalf("empty log: got %d, %v, want 0", got, err)
	}
	mustAppend(t, s, sbx1, 0, created(t, sbx1))
	want := mustAppend(t, s, sbx2, 0, created(t, sbx2), started(t, sbx2, 1))
	if got, err := s.LastSeq(ctx); err != nil || got != want {
		t.Errorf("got %d, %v, want %d", got, err, want)
	}
}

func testUnknownType(t *testing.T, s events.Store) {
	ctx := context.Background()
	future := events.Envelope{
		ID:        uuid.NewString(),
		SandboxID: sbx1,
		Type:      "sandbox.from_the_future",
		Schema:    events.SchemaVersion + 1,
		Time:      time.Now().UTC(),
		Actor:     "time-traveller",
		Phase:     "hibernating",
		Data:      json.RawMessage(`{"warp":9,"nested":{"a":[1,2]}}`),
	}
	first := mustAppend(t, s, sbx1, 0, created(t, sbx1))
	seq := mustAppend(t, s, sbx1, first, future)
	if got := mustLoad(t, s, sbx1, 0); len(got) != 1 || got[0].Seq != first {
		t.Fatalf("load: got %v, want only the created event at %d", ids(got), first)
	}
	if head, err := s.Head(ctx, sbx1); err != nil || head != seq {
		t.Fatalf("head: %d, %v; want %d, the unknown event's", head, err, seq)
	}
	// An append after it expects it, and followers step over it.
	last := mustAppend(t, s, sbx1, seq, started(t, sbx1, 1))
	f := follow(t, s, 0, 10)
	got := flatten(f.receive(t, 2))
	f.stop(t)
	if len(got) != 2 || got[0].Seq != first || got[1].Seq != last {
		t.Fatalf("follow: got %v, want the created and started events", ids(got))
	}
}

func testHead(t *testing.T, s events.Store) {
	ctx := context.Background()
	if got, err := s.Head(ctx, sbx1); err != nil || got != 0 {
		t.Fatalf("head of an empty subject: %d, %v; want 0", got, err)
	}
	a := mustAppend(t, s, sbx1, 0, created(t, sbx1))
	mustAppend(t, s, sbx2, 0, created(t, sbx2))
	if got, err := s.Head(ctx, sbx1); err != nil || got != a {
		t.Fatalf("head of sbx1: %d, %v; want %d (not sbx2's)", got, err, a)
	}
}

// Sandbox ids of the contract's tests: sandbox ids are uuids (events.ValidID);
// a message on any other subject is foreign.
const (
	sbx1  = "0193b0a4-0000-7000-8000-000000000001"
	sbx2  = "0193b0a4-0000-7000-8000-000000000002"
	sbx10 = "0193b0a4-0000-7000-8000-000000000010"
)

// More sandbox ids of the contract's tests.
const (
	sbxLate  = "0193b0a4-0000-7000-8000-00000000000a"
	sbxLive  = "0193b0a4-0000-7000-8000-00000000000b"
	sbxOther = "0193b0a4-0000-7000-8000-00000000000c"
)
