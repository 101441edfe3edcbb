package busauth_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/internal/busauth"
)

// TestACopyPastItsOriginIsMadeAgain: the view's bucket came back from a
// crash with fewer writes than its copy had taken (here: made again with
// one write, where the copy had two), and then took a write the copy never
// saw, at a sequence the copy holds already, which a mirror skips. Copies,
// told the origins' last sequences, makes that copy again (async, as
// asked; the events' copy, not past its origin, stays as it was made), and
// it holds the origin's view. Broken on purpose (no Origins) the copy keeps
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
	origins := map[string]uint64{}
	for _, name := range []string{busauth.EventStream, "KV_" + busauth.PhaseBucket} {
		s, err := b.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		origins[name] = s.CachedInfo().State.LastSeq
	}
	if err := busauth.Copies(ctx, cjs, busauth.CopyLimits{Events: 1 << 20, Phases: 1 << 20, Async: true, Origins: origins}); err != nil {
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
