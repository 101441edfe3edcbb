package busauth_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/internal/busauth"
)

// TestACopyPastItsOriginIsMadeAgain: the view's bucket came back from a
// crash with fewer writes than its copy had taken (here: made again with
// one write, where the copy had two), and then took a write the copy never
// saw, at a sequence the copy holds already, which a mirror skips. Copies,
// reading the origins' last sequences, makes that copy again (async, as
// asked; the events' copy, not past its origin, stays as it was made), and
// it holds the origin's view. Broken on purpose (no OriginLast) the copy keeps
// its stale view and never gets the new one.
func TestACopyPastItsOriginIsMadeAgain(t *testing.T) {
	b := startBus(t)
	ctx := t.Context()
	phases, err := b.js.KeyValue(ctx, busauth.PhaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := phases.Put(ctx, sandboxA, []byte(`{"phase":"suspended"}`)); err != nil {
		t.Fatal(err)
	}
	cjs, _ := jetstream.New(b.conn(t, nil, busauth.Grant{Role: busauth.ClientsService}))
	copyKV, err := cjs.KeyValue(ctx, busauth.PhaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	await := func(key, want string) bool {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if e, err := copyKV.Get(ctx, key); err == nil && string(e.Value()) == want {
				return true
			}
		}
		return false
	}
	if !await(sandboxA, `{"phase":"suspended"}`) {
		t.Fatal("the copy never took the second write")
	}

	// The crash: the origin keeps only a first write, then takes another.
	if err := b.js.DeleteKeyValue(ctx, busauth.PhaseBucket); err != nil {
		t.Fatal(err)
	}
	if phases, err = b.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: busauth.PhaseBucket}); err != nil {
		t.Fatal(err)
	}
	if _, err := phases.Put(ctx, sandboxB, []byte(`{"phase":"ready"}`)); err != nil {
		t.Fatal(err)
	}
	if err := busauth.Copies(ctx, cjs, busauth.CopyLimits{Events: 1 << 20, Phases: 1 << 20, Async: true, OriginLast: originLast(b.js)}); err != nil {
		t.Fatal(err)
	}
	if copyKV, err = cjs.KeyValue(ctx, busauth.PhaseBucket); err != nil {
		t.Fatal(err)
	}
	if !await(sandboxB, `{"phase":"ready"}`) {
		t.Fatal("the copy of the view never took the origin's write after the crash")
	}
	if _, err := copyKV.Get(ctx, sandboxA); err == nil {
		t.Error("the copy still holds a view its origin lost")
	}
	for name, want := range map[string]jetstream.PersistModeType{"KV_" + busauth.PhaseBucket: jetstream.AsyncPersistMode, busauth.EventStream: jetstream.DefaultPersistMode} {
		s, err := cjs.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.PersistMode; got != want {
			t.Errorf("the copy %s: persist mode %s, want %s", name, got, want)
		}
	}
}

// originLast reads an origin's last sequence through js.
func originLast(js jetstream.JetStream) func(context.Context, string) (uint64, error) {
	return func(ctx context.Context, stream string) (uint64, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return 0, err
		}
		return s.CachedInfo().State.LastSeq, nil
	}
}

// TestACopyCaughtUpIsKept: a copy that took writes its origin made while
// Copies ran (another serve on the bus writing while this one starts) is
// not past its origin, and is kept: Copies reads the copy before its
// origin, and an origin only grows. Here the origin's last sequence is
// read, then one more write lands and the copy takes it, then the copy
// would be read, were it read after its origin. Broken on purpose (the
// origin read before the copy) the copy is deleted, and made again.
func TestACopyCaughtUpIsKept(t *testing.T) {
	b := startBus(t)
	ctx := t.Context()
	phases, err := b.js.KeyValue(ctx, busauth.PhaseBucket)
	if err != nil {
		t.Fatal(err)
	}
	cjs, _ := jetstream.New(b.conn(t, nil, busauth.Grant{Role: busauth.ClientsService}))
	copyOf := func() *jetstream.StreamInfo {
		t.Helper()
		s, err := cjs.Stream(ctx, "KV_"+busauth.PhaseBucket)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo()
	}
	before := copyOf().Created
	write := func() uint64 {
		t.Helper()
		rev, err := phases.Put(ctx, sandboxA, []byte(`{"phase":"ready"}`))
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); copyOf().State.LastSeq < rev; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the copy never took the write")
			}
		}
		return rev
	}
	write()
	busy := func(ctx context.Context, stream string) (uint64, error) {
		last, err := originLast(b.js)(ctx, stream)
		if err == nil && stream == "KV_"+busauth.PhaseBucket {
			write() // lands, and is copied, after the origin was read
		}
		return last, err
	}
	if err := busauth.Copies(ctx, cjs, busauth.CopyLimits{Events: 1 << 20, Phases: 1 << 20, OriginLast: busy}); err != nil {
		t.Fatal(err)
	}
	if got := copyOf().Created; !got.Equal(before) {
		t.Errorf("the copy was made again (created %s, before %s): a copy caught up was taken for one past its origin", got, before)
	}
}
