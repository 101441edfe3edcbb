package kvview

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
)

// position is the value of key in the positions bucket, "" if it has none.
func position(t *testing.T, js jetstream.JetStream, key string) string {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), "torpor_positions")
	if err != nil {
		t.Fatalf("positions bucket: %v", err)
	}
	e, err := kv.Get(context.Background(), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ""
	}
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return string(e.Value())
}

// TestBucketHoldsViewsOnly: after a log is applied, the view's bucket holds
// one key per sandbox, a sandbox id, and nothing else; the checkpoint is in
// the positions bucket, under a key naming the view's bucket.
func TestBucketHoldsViewsOnly(t *testing.T) {
	srv := natstest.Start(t)
	v := newView(t, srv.JS)
	log := randomLog(t, 5, 10, 100)
	applyBatch(t, v, log[:60]...)
	applyBatch(t, v, log[60:]...)
	sandboxes := map[string]bool{}
	for _, env := range log {
		sandboxes[env.SandboxID] = true
	}
	keys := dump(t, v)
	for k := range keys {
		if _, err := uuid.Parse(k); err != nil || !sandboxes[k] {
			t.Errorf("torpor_phases holds key %q: not a sandbox of the log", k)
		}
	}
	if len(keys) != len(sandboxes) {
		t.Errorf("torpor_phases holds %d keys, want one per sandbox: %d", len(keys), len(sandboxes))
	}
	if got := position(t, srv.JS, "kvview.torpor_phases"); got != "100" {
		t.Errorf("checkpoint in torpor_positions = %q, want 100", got)
	}
}

// TestCheckpointOfARebuildIsItsOwn: a rebuild into another bucket keeps its
// checkpoint under a key of its own, beside the live view's.
func TestCheckpointOfARebuildIsItsOwn(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	log := randomLog(t, 6, 10, 50)
	store := storeWith(t, srv.JS, log)
	live := newView(t, srv.JS)
	applyBatch(t, live, log[:20]...)
	if _, err := Rebuild(ctx, srv.JS, store, Config{Bucket: "torpor_phases_rebuild"}); err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	for key, want := range map[string]string{"kvview.torpor_phases": "20", "kvview.torpor_phases_rebuild": "50"} {
		if got := position(t, srv.JS, key); got != want {
			t.Errorf("position %s = %q, want %s", key, got, want)
		}
	}
	rebuilt := newBucket(t, srv.JS, "torpor_phases_rebuild")
	if _, ok := dump(t, rebuilt)[legacyKey]; ok {
		t.Errorf("the rebuilt bucket holds %s", legacyKey)
	}
}

// TestCheckpointMovesOutOfAnOldBucket: a data directory of an older build
// keeps the checkpoint in the view's bucket under _torpor.checkpoint. When
// the view opens it after a restart, the positions bucket takes that value
// unless it holds a higher one, the old key is gone, and no reader shows it.
func TestCheckpointMovesOutOfAnOldBucket(t *testing.T) {
	tests := []struct {
		name    string
		already string // the new key before the move; "" for none
		want    uint64
	}{
		{"no checkpoint in the positions bucket", "", 7},
		{"a lower one there", "3", 7},
		{"a higher one there (a move cut short, then progress)", "9", 9},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := natstest.Start(t)
			ctx := context.Background()
			// The old layout, written by hand.
			old, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "torpor_phases", History: 1, Storage: jetstream.FileStorage})
			if err != nil {
				t.Fatal(err)
			}
			id := newID(t)
			data, _ := json.Marshal(events.View{ID: id, Name: "box", Phase: events.PhaseReady, Generation: 1, Seq: 2})
			if _, err := old.Put(ctx, id, data); err != nil {
				t.Fatal(err)
			}
			if _, err := old.Put(ctx, "_torpor.checkpoint", []byte("7")); err != nil {
				t.Fatal(err)
			}
			if tc.already != "" {
				pos, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "torpor_positions", History: 1, Storage: jetstream.FileStorage})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := pos.Put(ctx, "kvview.torpor_phases", []byte(tc.already)); err != nil {
					t.Fatal(err)
				}
			}
			dir := srv.Dir
			srv.Stop()
			srv = natstest.StartWith(t, natstest.Options{Dir: dir})

			v := newView(t, srv.JS)
			checkpointIs(t, v, tc.want)
			if got, want := position(t, srv.JS, "kvview.torpor_phases"), strconv.FormatUint(tc.want, 10); got != want {
				t.Errorf("position kvview.torpor_phases = %q, want %s", got, want)
			}
			if _, err := v.kv.Get(ctx, "_torpor.checkpoint"); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Errorf("the old checkpoint key is still in torpor_phases (get: %v)", err)
			}
			readersShowOnly(t, v, id, 2)
			// The next writer goes on from the moved checkpoint.
			applyBatch(t, v, env(t, id, 10, events.PhaseStopping, &events.ForwardClosed{ForwardID: "f"}))
			checkpointIs(t, newView(t, srv.JS), 10)
		})
	}
}

// TestReadersSkipTheOldCheckpointKey: an older build still writing the same
// bucket puts its checkpoint back under _torpor.checkpoint; no reader shows
// it as a view.
func TestReadersSkipTheOldCheckpointKey(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	applyBatch(t, v, env(t, id, 1, events.PhaseProvisioning, created(id, nil)),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	if _, err := v.kv.Put(context.Background(), legacyKey, []byte("2")); err != nil {
		t.Fatal(err)
	}
	readersShowOnly(t, v, id, 2)
}

// readersShowOnly checks that List, Counts, Get, Wait and Watch show the
// view of sandbox id, at seq, and nothing else of v's bucket (the old
// checkpoint key least of all); Watch is checked through a change at seq+1.
func readersShowOnly(t *testing.T, v *View, id string, seq uint64) {
	t.Helper()
	ctx := context.Background()
	page, err := v.List(ctx, Query{})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != id {
		t.Errorf("List = %v, %v; want the one sandbox", ids(page.Items), err)
	}
	counts, err := v.Counts(ctx)
	if err != nil || counts[events.PhaseReady] != 1 {
		t.Errorf("Counts = %v, %v; want one ready", counts, err)
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	if total != 1 {
		t.Errorf("Counts total %d, want 1", total)
	}
	if _, err := v.Get(ctx, legacyKey); !errors.Is(err, events.ErrNotFound) {
		t.Errorf("Get(%s) = %v, want ErrNotFound", legacyKey, err)
	}
	if _, err := v.Wait(ctx, legacyKey, events.PhaseReady, 0); !errors.Is(err, events.ErrNotFound) {
		t.Errorf("Wait(%s) = %v, want ErrNotFound", legacyKey, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := v.Watch(wctx, 0)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	// A later change comes after every current value: nothing but the
	// sandbox's view may show up in between. (Its view at seq is skipped
	// when the change replaced it before the watch delivered it: a KV watch
	// gives the newest value of a key, not each one.)
	applyBatch(t, v, env(t, id, seq+1, events.PhaseStopping, &events.StopRequested{Generation: 1}))
	for {
		select {
		case got := <-ch:
			if got.ID != id || (got.Seq != seq && got.Seq != seq+1) {
				t.Fatalf("watched %q at %d, want only %s at %d or %d", got.ID, got.Seq, id, seq, seq+1)
			}
			if got.Seq == seq+1 {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no view at %d watched", seq+1)
		}
	}
}

// TestCheckpointOfADeletedBucketIsForgotten: a bucket deleted and made again
// under the same name (a failed rebuild's, a benchmark's) starts from 0, not
// from the checkpoint the deleted one left in the positions bucket, which
// would be ahead of its views.
func TestCheckpointOfADeletedBucketIsForgotten(t *testing.T) {
	srv := natstest.Start(t)
	v := newBucket(t, srv.JS, "gone")
	applyBatch(t, v, randomLog(t, 7, 5, 40)...)
	checkpointIs(t, v, 40)
	if err := srv.JS.DeleteKeyValue(context.Background(), "gone"); err != nil {
		t.Fatal(err)
	}
	w := newBucket(t, srv.JS, "gone")
	checkpointIs(t, w, 0)
	// And the forgotten key is written again from the start.
	log := randomLog(t, 8, 5, 10)
	applyBatch(t, w, log...)
	checkpointIs(t, newBucket(t, srv.JS, "gone"), 10)
}
