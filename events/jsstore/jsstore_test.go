package jsstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/events/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) events.Store {
		return newStore(t, natstest.Start(t))
	})
}

func newStore(t testing.TB, srv *natstest.Server) *jsstore.Store {
	t.Helper()
	s, err := jsstore.New(context.Background(), srv.JS, jsstore.Config{})
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	return s
}

func envelope(t testing.TB, id string, g int64) events.Envelope {
	t.Helper()
	return storetest.NewEnvelope(t, id, &events.Started{Generation: g})
}

func msgCount(t *testing.T, s *jsstore.Store) uint64 {
	t.Helper()
	info, err := s.Stream().Info(context.Background())
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Msgs
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  jsstore.Config
		ok   bool
	}{
		{"zero value means defaults", jsstore.Config{}, true},
		{"three replicas", jsstore.Config{Replicas: 3}, true},
		{"memory storage", jsstore.Config{Storage: jetstream.MemoryStorage}, true},
		{"dotted stream name", jsstore.Config{Stream: "a.b"}, false},
		{"wildcard stream name", jsstore.Config{Stream: "A>"}, false},
		{"too many replicas", jsstore.Config{Replicas: 7}, false},
		{"negative replicas", jsstore.Config{Replicas: -1}, false},
		{"negative duplicate window", jsstore.Config{DuplicateWindow: -time.Second}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if got := err == nil; got != tc.ok {
				t.Errorf("Validate() = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

func TestNewSetsUpTheStream(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	info, err := s.Stream().Info(context.Background())
	if err != nil {
		t.Fatalf("info: %v", err)
	}
	c := info.Config
	if c.Name != jsstore.DefaultStream || len(c.Subjects) != 1 || c.Subjects[0] != "torpor.sandbox.>" ||
		!c.AllowAtomicPublish || !c.AllowDirect || c.Duplicates != jsstore.DefaultDuplicateWindow ||
		c.Storage != jetstream.FileStorage || c.Replicas != 1 {
		t.Errorf("stream config: got %+v", c)
	}
	// New again on the same stream is fine (create or update).
	newStore(t, srv)
}

// TestBindChangesNothing: Bind works on the stream as it is (its duplicate
// window stays what its owner set, where New would reset it), appends and
// reads like the owner's store, and refuses a stream that does not exist.
func TestBindChangesNothing(t *testing.T) {
	ctx := context.Background()
	srv := natstest.Start(t)
	if _, err := jsstore.Bind(ctx, srv.JS, ""); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("bind before the stream exists: %v, want stream not found", err)
	}
	owner, err := jsstore.New(ctx, srv.JS, jsstore.Config{DuplicateWindow: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := jsstore.Bind(ctx, srv.JS, "")
	if err != nil {
		t.Fatal(err)
	}
	info, err := owner.Stream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Config.Duplicates; got != 30*time.Second {
		t.Errorf("duplicate window after Bind: %s, want the owner's 30s", got)
	}
	env := envelope(t, "0193b0a4-0000-7000-8000-000000000001", 1)
	if _, err := s.Append(ctx, env.SandboxID, 0, env); err != nil {
		t.Fatalf("append through the bound store: %v", err)
	}
	got, err := owner.Load(ctx, env.SandboxID, 0)
	if err != nil || len(got) != 1 || got[0].ID != env.ID {
		t.Errorf("the owner loads %v (%v), want the bound store's append", got, err)
	}
	last, err := s.LastSeq(ctx)
	if err != nil || last != got[0].Seq {
		t.Errorf("bound last seq %d (%v), want %d", last, err, got[0].Seq)
	}
	if _, err := s.Position(ctx, "bound"); err != nil {
		t.Errorf("position on the bound store: %v", err)
	}
}

func TestAtomicBatchIsContiguous(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	envs := []events.Envelope{envelope(t, "0193b0a4-0000-7000-8000-000000000001", 1), envelope(t, "0193b0a4-0000-7000-8000-000000000001", 2), envelope(t, "0193b0a4-0000-7000-8000-000000000001", 3)}
	last, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", 0, envs...)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	if got := msgCount(t, s); got != 3 {
		t.Fatalf("messages in stream: got %d, want 3", got)
	}
	for i, env := range envs {
		seq := last - 2 + uint64(i)
		msg, err := s.Stream().GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		if msg.Subject != "torpor.sandbox.0193b0a4-0000-7000-8000-000000000001" {
			t.Errorf("subject at %d: got %q", seq, msg.Subject)
		}
		if got := msg.Header.Get(jetstream.MsgIDHeader); got != env.ID {
			t.Errorf("msg id at %d: got %q, want %q", seq, got, env.ID)
		}
		if got := msg.Header.Get(jsstore.HeaderType); got != "sandbox.started" {
			t.Errorf("type header at %d: got %q", seq, got)
		}
	}
}

func TestRawWrongLastSequenceIsConflict(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	first, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", 0, envelope(t, "0193b0a4-0000-7000-8000-000000000001", 1))
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	// Someone else writes to the subject behind the store's back.
	other := &nats.Msg{Subject: jsstore.Subject("0193b0a4-0000-7000-8000-000000000001"), Header: nats.Header{}, Data: []byte(`{}`)}
	other.Header.Set(jetstream.MsgIDHeader, "intruder")
	if _, err := srv.JS.PublishMsg(ctx, other, jetstream.WithExpectLastSequencePerSubject(first)); err != nil {
		t.Fatalf("raw publish: %v", err)
	}
	// A raw publish with the stale sequence gets the server's 10071 ...
	stale := &nats.Msg{Subject: jsstore.Subject("0193b0a4-0000-7000-8000-000000000001"), Data: []byte(`{}`)}
	_, err = srv.JS.PublishMsg(ctx, stale, jetstream.WithExpectLastSequencePerSubject(first))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("raw stale publish: got %v, want error code 10071", err)
	}
	// ... which the store turns into ErrConflict, for one event and a batch.
	for _, envs := range [][]events.Envelope{
		{envelope(t, "0193b0a4-0000-7000-8000-000000000001", 2)},
		{envelope(t, "0193b0a4-0000-7000-8000-000000000001", 2), envelope(t, "0193b0a4-0000-7000-8000-000000000001", 3)},
	} {
		_, err = s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", first, envs...)
		if !errors.Is(err, events.ErrConflict) {
			t.Errorf("append %d events on a stale sequence: got %v, want ErrConflict", len(envs), err)
		}
	}
	if got := msgCount(t, s); got != 2 {
		t.Errorf("messages in stream: got %d, want 2", got)
	}
}

func TestRetryThatLanded(t *testing.T) {
	tests := []struct {
		name string
		n    int
	}{
		{"one event", 1},
		{"atomic batch", 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.Start(t)
			s := newStore(t, srv)
			ctx := context.Background()
			base, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", 0, envelope(t, "0193b0a4-0000-7000-8000-000000000001", 0))
			if err != nil {
				t.Fatalf("append: %v", err)
			}
			var envs []events.Envelope
			for i := range tc.n {
				envs = append(envs, envelope(t, "0193b0a4-0000-7000-8000-000000000001", int64(i+1)))
			}
			seq, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", base, envs...)
			if err != nil {
				t.Fatalf("append: %v", err)
			}
			before := msgCount(t, s)
			again, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", base, envs...)
			if err != nil {
				t.Fatalf("retry: got %v, want success", err)
			}
			if again != seq {
				t.Errorf("retry seq: got %d, want %d", again, seq)
			}
			if got := msgCount(t, s); got != before {
				t.Errorf("messages in stream after retry: got %d, want %d", got, before)
			}
		})
	}
}

func TestRetryWithoutConcurrencyCheckIsDeduplicated(t *testing.T) {
	// The expected sequence still matches (nothing landed before), but the
	// message id is known: the server's deduplication answers.
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	env := envelope(t, "0193b0a4-0000-7000-8000-000000000001", 1)
	seq, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", 0, env)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	// Publish the same message id to a fresh subject of the same stream.
	env2 := env
	env2.SandboxID = "0193b0a4-0000-7000-8000-000000000002"
	got, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000002", 0, env2)
	if err != nil || got != seq {
		t.Errorf("duplicate id on another subject: got %d, %v, want %d, nil", got, err, seq)
	}
	if n := msgCount(t, s); n != 1 {
		t.Errorf("messages in stream: got %d, want 1", n)
	}
}

func TestUnavailableWhenServerIsGone(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	srv.Shutdown()
	srv.WaitForShutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", 0, envelope(t, "0193b0a4-0000-7000-8000-000000000001", 1))
	if !errors.Is(err, events.ErrUnavailable) {
		t.Errorf("append: got %v, want ErrUnavailable", err)
	}
	if _, err := s.Load(ctx, "0193b0a4-0000-7000-8000-000000000001", 0); !errors.Is(err, events.ErrUnavailable) {
		t.Errorf("load: got %v, want ErrUnavailable", err)
	}
}

// TestLoadManyEvents loads a subject of several batches, on a connection
// with nats.go's default sync queue and on one with SyncQueueLen.
func TestLoadManyEvents(t *testing.T) {
	if jsstore.SyncQueueLen < 2*1000 {
		t.Fatalf("SyncQueueLen %d does not hold a batch of 1000 with room", jsstore.SyncQueueLen)
	}
	t.Run("default queue", func(t *testing.T) {
		srv := natstest.Start(t)
		loadManyEvents(t, newStore(t, srv))
	})
	t.Run("SyncQueueLen", func(t *testing.T) {
		srv := natstest.Start(t)
		nc, err := nats.Connect("", nats.InProcessServer(srv.Server), nats.SyncQueueLen(jsstore.SyncQueueLen))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		s, err := jsstore.New(context.Background(), js, jsstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		loadManyEvents(t, s)
	})
}

func loadManyEvents(t *testing.T, s *jsstore.Store) {
	ctx := context.Background()
	const batches, per = 25, 100
	var last uint64
	for b := range batches {
		var envs []events.Envelope
		for i := range per {
			envs = append(envs, envelope(t, "0193b0a4-0000-7000-8000-0000000000b1", int64(b*per+i)))
		}
		var err error
		if last, err = s.Append(ctx, "0193b0a4-0000-7000-8000-0000000000b1", last, envs...); err != nil {
			t.Fatalf("append batch %d: %v", b, err)
		}
		if _, err := s.Append(ctx, "0193b0a4-0000-7000-8000-0000000000b2", 0, envelope(t, "0193b0a4-0000-7000-8000-0000000000b2", 0)); err != nil && b == 0 {
			t.Fatalf("append small: %v", err)
		}
	}
	got, err := s.Load(ctx, "0193b0a4-0000-7000-8000-0000000000b1", 0)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if len(got) != batches*per {
		t.Fatalf("load: got %d events, want %d", len(got), batches*per)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Fatalf("load out of order at %d: %d after %d", i, got[i].Seq, got[i-1].Seq)
		}
	}
	if got[len(got)-1].Seq != last {
		t.Errorf("last loaded: got %d, want %d", got[len(got)-1].Seq, last)
	}
	tail, err := s.Load(ctx, "0193b0a4-0000-7000-8000-0000000000b1", got[len(got)-1-1500].Seq)
	if err != nil || len(tail) != 1500 {
		t.Errorf("load tail: got %d, %v, want 1500", len(tail), err)
	}
}

func TestRestart(t *testing.T) {
	srv := natstest.Start(t)
	dir := srv.Dir
	s := newStore(t, srv)
	ctx := context.Background()

	var want []string
	var last uint64
	for i := range 3 {
		env := envelope(t, "0193b0a4-0000-7000-8000-000000000001", int64(i))
		var err error
		if last, err = s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", last, env); err != nil {
			t.Fatalf("append: %v", err)
		}
		want = append(want, env.ID)
	}
	// A follower handles everything so far and keeps its position.
	pos, err := s.Position(ctx, "restart")
	if err != nil {
		t.Fatalf("position: %v", err)
	}
	fctx, cancel := context.WithTimeout(ctx, storetest.Timeout)
	defer cancel()
	err = s.Follow(fctx, 0, 10, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
		if err := pos.Set(ctx, envs[len(envs)-1].Seq); err != nil {
			return err
		}
		if pending == 0 {
			cancel()
		}
		return nil
	})
	if err != nil || fctx.Err() == context.DeadlineExceeded {
		t.Fatalf("follow to the head: %v (context: %v)", err, fctx.Err())
	}
	srv.Stop()

	srv = natstest.StartWith(t, natstest.Options{Dir: dir})
	s = newStore(t, srv)
	got, err := s.Load(ctx, "0193b0a4-0000-7000-8000-000000000001", 0)
	if err != nil {
		t.Fatalf("load after restart: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("load after restart: got %d events, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].ID != want[i] {
			t.Errorf("event %d: got %s, want %s", i, got[i].ID, want[i])
		}
	}
	env := envelope(t, "0193b0a4-0000-7000-8000-000000000001", 9)
	if _, err := s.Append(ctx, "0193b0a4-0000-7000-8000-000000000001", last, env); err != nil {
		t.Fatalf("append after restart: %v", err)
	}
	if pos, err = s.Position(ctx, "restart"); err != nil {
		t.Fatalf("position after restart: %v", err)
	}
	after, err := pos.Get(ctx)
	if err != nil || after != last {
		t.Fatalf("position after restart: got %d, %v, want %d", after, err, last)
	}
	if got := follow(t, s, after, 1); len(got) != 1 || got[0].ID != env.ID {
		t.Errorf("following from the kept position: got %v, want only the new event %s", got, env.ID)
	}
}

// follow follows s from after until n events have come, and returns them.
func follow(t *testing.T, s *jsstore.Store, after uint64, n int) []events.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), storetest.Timeout)
	defer cancel()
	var got []events.Envelope
	err := s.Follow(ctx, after, 100, func(ctx context.Context, envs []events.Envelope, pending uint64) error {
		got = append(got, envs...)
		if len(got) >= n {
			cancel()
		}
		return nil
	})
	if err != nil || ctx.Err() == context.DeadlineExceeded {
		t.Fatalf("follow from %d: %v with %d events in %v, want %d", after, err, len(got), storetest.Timeout, n)
	}
	return got
}

// TestForeignMessagesAreSkipped: any NATS client can publish on a sandbox's
// subject. Whatever is not a torpor event this build reads is left out by
// Load, Follow and Replay, reported once, counted, and Head still counts it,
// so an append after it lands.
func TestForeignMessagesAreSkipped(t *testing.T) {
	srv := natstest.Start(t)
	var reported []jsstore.Foreign
	var mu sync.Mutex
	s, err := jsstore.New(context.Background(), srv.JS, jsstore.Config{OnForeign: func(f jsstore.Foreign) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, f)
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const id = "0193b0a4-0000-7000-8000-000000000001"
	valid := func(g int64) events.Envelope { return envelope(t, id, g) }
	body := func(env events.Envelope) []byte {
		b, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	other := valid(9)
	other.SandboxID = "0193b0a4-0000-7000-8000-000000000002"
	future := valid(9)
	future.Schema = events.SchemaVersion + 1
	unknown := valid(9)
	unknown.Type = "sandbox.from_the_future"
	typed := func(typ string) nats.Header { return nats.Header{jsstore.HeaderType: []string{typ}} }
	foreign := []struct {
		name string
		msg  *nats.Msg
	}{
		{"not JSON", &nats.Msg{Data: []byte("not json"), Header: typed("sandbox.started")}},
		{"no type header", &nats.Msg{Data: body(valid(9))}},
		{"a type header that is not the body's", &nats.Msg{Data: body(valid(9)), Header: typed("sandbox.stopped")}},
		{"an unknown type", &nats.Msg{Data: body(unknown), Header: typed(unknown.Type)}},
		{"a schema from the future", &nats.Msg{Data: body(future), Header: typed(future.Type)}},
		{"another sandbox's event", &nats.Msg{Data: body(other), Header: typed(other.Type)}},
	}
	first, err := s.Append(ctx, id, 0, valid(1))
	if err != nil {
		t.Fatal(err)
	}
	last := first
	for _, f := range foreign {
		f.msg.Subject = jsstore.Subject(id)
		ack, err := srv.JS.PublishMsg(ctx, f.msg)
		if err != nil {
			t.Fatalf("publish %s: %v", f.name, err)
		}
		last = ack.Sequence
	}
	// A well-formed event on a subject whose id is no sandbox id (not a
	// uuid) is foreign too: no reader makes a sandbox of it.
	zz := valid(1)
	zz.SandboxID = "ZZ"
	if _, err := srv.JS.PublishMsg(ctx, &nats.Msg{Subject: jsstore.Subject("ZZ"), Data: body(zz), Header: typed(zz.Type)}); err != nil {
		t.Fatalf("publish on ZZ: %v", err)
	}
	foreign = append(foreign, struct {
		name string
		msg  *nats.Msg
	}{"an event on a subject whose id is not a sandbox id", nil})
	head, err := s.Head(ctx, id)
	if err != nil || head != last {
		t.Fatalf("head %d, %v; want %d, the last foreign message's", head, err, last)
	}
	second, err := s.Append(ctx, id, head, valid(2))
	if err != nil {
		t.Fatalf("append after the foreign messages: %v", err)
	}
	for i := 0; i < 2; i++ { // read twice: reported once
		got, err := s.Load(ctx, id, 0)
		if err != nil || len(got) != 2 || got[0].Seq != first || got[1].Seq != second {
			t.Fatalf("load: %v, %v; want the two valid events", ids(got), err)
		}
		if got, err := s.Load(ctx, id, first); err != nil || len(got) != 1 || got[0].Seq != second {
			t.Fatalf("load after %d: %v, %v; want the second valid event", first, ids(got), err)
		}
	}
	if got := follow(t, s, 0, 2); len(got) != 2 || got[0].Seq != first || got[1].Seq != second {
		t.Errorf("follow: %v, want the two valid events", ids(got))
	}
	var replayed []events.Envelope
	if _, err := s.Replay(ctx, 0, func(envs []events.Envelope) error { replayed = append(replayed, envs...); return nil }); err != nil {
		t.Fatalf("replay: %v", err)
	}
	if len(replayed) != 2 {
		t.Errorf("replay: %v, want the two valid events", ids(replayed))
	}
	if n := s.Foreign(); n != uint64(len(foreign)) {
		t.Errorf("counted %d foreign messages, want %d", n, len(foreign))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != len(foreign) {
		t.Fatalf("reported %d times, want once per foreign message (%d)", len(reported), len(foreign))
	}
	for i, f := range reported {
		subject := jsstore.Subject(id)
		if foreign[i].msg == nil {
			subject = jsstore.Subject("ZZ")
		}
		if !errors.Is(f.Err, events.ErrForeign) || f.Seq != first+uint64(i)+1 || f.Subject != subject {
			t.Errorf("report %d (%s): %+v; want ErrForeign at seq %d", i, foreign[i].name, f, first+uint64(i)+1)
		}
	}
}

func ids(envs []events.Envelope) []uint64 {
	out := make([]uint64, len(envs))
	for i, e := range envs {
		out[i] = e.Seq
	}
	return out
}

func TestPosition(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	p, err := s.Position(ctx, "views.kv-1")
	if err != nil {
		t.Fatalf("position: %v", err)
	}
	if got, err := p.Get(ctx); err != nil || got != 0 {
		t.Errorf("before any set: got %d, %v, want 0", got, err)
	}
	for _, seq := range []uint64{42, 7, 1<<64 - 1} {
		if err := p.Set(ctx, seq); err != nil {
			t.Fatalf("set %d: %v", seq, err)
		}
		if got, err := p.Get(ctx); err != nil || got != seq {
			t.Errorf("after set %d: got %d, %v", seq, got, err)
		}
	}
	if err := p.Set(ctx, 1234); err != nil {
		t.Fatal(err)
	}

	// Another store on the same server sees it, under the same name only.
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	other, err := jsstore.New(ctx, js, jsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint64{"views.kv-1": 1234, "views.kv-2": 0} {
		p, err := other.Position(ctx, name)
		if err != nil {
			t.Fatalf("position %s: %v", name, err)
		}
		if got, err := p.Get(ctx); err != nil || got != want {
			t.Errorf("position %s from another store: got %d, %v, want %d", name, got, err, want)
		}
	}
	kv, err := srv.JS.KeyValue(ctx, jsstore.PositionBucket)
	if err != nil {
		t.Fatalf("bucket: %v", err)
	}
	e, err := kv.Get(ctx, "views.kv-1")
	if err != nil {
		t.Fatalf("get the key: %v", err)
	}
	if got := string(e.Value()); got != "1234" {
		t.Errorf("stored value: got %q, want decimal 1234", got)
	}

	for _, name := range []string{"", "a b", "a*", "a>", ".a", "a.", "a..b", "ü"} {
		if _, err := s.Position(ctx, name); err == nil {
			t.Errorf("position %q: got nil error", name)
		}
	}
}

func ExampleSubject() {
	fmt.Println(jsstore.Subject("sbx-01j9"))
	// Output: torpor.sandbox.sbx-01j9
}

func TestLostAnswerIsResolved(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	landed := envelope(t, "0193b0a4-0000-7000-8000-000000000001", 1)
	// The append landed but its answer never came: publish it as the store
	// would, then append again with a context that ends before any answer.
	body, err := json.Marshal(landed)
	if err != nil {
		t.Fatal(err)
	}
	msg := &nats.Msg{Subject: jsstore.Subject("0193b0a4-0000-7000-8000-000000000001"), Header: nats.Header{}, Data: body}
	msg.Header.Set(jetstream.MsgIDHeader, landed.ID)
	ack, err := srv.JS.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatalf("raw publish: %v", err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()

	seq, err := s.Append(gone, "0193b0a4-0000-7000-8000-000000000001", 0, landed)
	if err != nil || seq != ack.Sequence {
		t.Errorf("append that landed: got %d, %v, want %d, nil", seq, err, ack.Sequence)
	}
	_, err = s.Append(gone, "0193b0a4-0000-7000-8000-000000000001", ack.Sequence, envelope(t, "0193b0a4-0000-7000-8000-000000000001", 2))
	if !errors.Is(err, events.ErrUnavailable) {
		t.Errorf("append that did not land: got %v, want ErrUnavailable", err)
	}
	if got := msgCount(t, s); got != 1 {
		t.Errorf("messages in stream: got %d, want 1", got)
	}
}

// TestPositionGarbage (issue 23, attack 7): a position that holds no
// sequence does not stop its follower from starting: it starts from 0,
// the store says so, and the next Set overwrites it.
func TestPositionGarbage(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	var told []string
	s, err := jsstore.New(ctx, srv.JS, jsstore.Config{OnBadPosition: func(name string, err error) { told = append(told, name) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Position(ctx, "sagas.n1"); err != nil {
		t.Fatal(err)
	}
	kv, err := srv.JS.KeyValue(ctx, jsstore.PositionBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "sagas.n1", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	p, err := s.Position(ctx, "sagas.n1")
	if err != nil {
		t.Fatalf("position over garbage: %v", err)
	}
	if got, err := p.Get(ctx); err != nil || got != 0 {
		t.Errorf("Get over garbage = %d, %v; want 0", got, err)
	}
	if len(told) == 0 || told[0] != "sagas.n1" {
		t.Errorf("told of %v, want sagas.n1", told)
	}
	if err := p.Set(ctx, 9); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Get(ctx); err != nil || got != 9 {
		t.Errorf("after Set 9: %d, %v", got, err)
	}
}
