package kvview

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections"
)

var _ projections.BatchProjection = (*View)(nil)

func applyBatch(t *testing.T, v *View, envs ...events.Envelope) {
	t.Helper()
	if err := v.ApplyBatch(context.Background(), envs); err != nil {
		t.Fatalf("ApplyBatch seq %d..%d: %v", envs[0].Seq, envs[len(envs)-1].Seq, err)
	}
}

func checkpointIs(t *testing.T, v *View, want uint64) {
	t.Helper()
	got, err := v.Checkpoint(context.Background())
	if err != nil || got != want {
		t.Errorf("Checkpoint = %d, %v; want %d", got, err, want)
	}
}

func TestApplyBatchEqualsApply(t *testing.T) {
	js := natstest.Start(t).JS
	one, many := newBucket(t, js, "one_at_a_time"), newBucket(t, js, "batched")
	log := randomLog(t, 1, 150, 3000)
	// Deliver with redeliveries: now and then an earlier event comes again.
	r := rand.New(rand.NewPCG(2, 2))
	var delivered []events.Envelope
	for i, env := range log {
		delivered = append(delivered, env)
		if i > 0 && r.IntN(20) == 0 {
			delivered = append(delivered, log[r.IntN(i)])
		}
	}

	apply(t, one, delivered...)
	for rest := delivered; len(rest) > 0; {
		n := min(len(rest), 1+r.IntN(300))
		applyBatch(t, many, rest[:n]...)
		rest = rest[n:]
	}
	sameBucket(t, one, many)
	checkpointIs(t, many, uint64(len(log)))
	// Every view went to the bucket, and equals a fold in memory.
	want := map[string]*events.View{}
	for _, env := range log {
		if want[env.SandboxID] == nil {
			want[env.SandboxID] = &events.View{}
		}
		want[env.SandboxID].Fold(env)
	}
	for id, w := range want {
		sameView(t, get(t, many, id), *w)
	}
}

func TestApplyBatchWritesEachViewOnce(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	a, b := newID(t), newID(t)
	batch := []events.Envelope{env(t, a, 1, events.PhaseProvisioning, created(a, nil))}
	attached := map[string]bool{}
	for seq := uint64(2); seq <= 50; seq++ {
		id := a
		if seq%10 == 0 {
			id = b
		}
		if seq == 10 {
			batch = append(batch, env(t, b, seq, events.PhaseProvisioning, created(b, nil)))
			continue
		}
		var e events.Event = &events.Started{Generation: 1} // a fact in ready
		if !attached[id] {
			attached[id], e = true, &events.SupervisorAttached{Generation: 1}
		}
		batch = append(batch, env(t, id, seq, events.PhaseReady, e))
	}
	before := streamLast(t, v)
	applyBatch(t, v, batch...)
	// One write per sandbox, whatever the events (the checkpoint is not in
	// the view's bucket).
	if got := streamLast(t, v) - before; got != 2 {
		t.Errorf("writes for 50 events of 2 sandboxes = %d, want 2", got)
	}
	if got := get(t, v, a); got.Seq != 49 || got.Phase != events.PhaseReady {
		t.Errorf("view of a: seq %d phase %s, want 49 ready", got.Seq, got.Phase)
	}
	if got := get(t, v, b); got.Seq != 50 {
		t.Errorf("view of b: seq %d, want 50", got.Seq)
	}
	checkpointIs(t, v, 50)
}

func TestApplyBatchSkips(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	unknown := env(t, id, 6, events.PhaseError, &events.Exited{Generation: 1, Code: 3})
	unknown.Type = "sandbox.from_the_future"
	applyBatch(t, v, env(t, id, 5, events.PhaseProvisioning, created(id, nil)), unknown)
	want := get(t, v, id)
	if want.Seq != 5 || want.Phase != events.PhaseProvisioning || want.ExitCode != nil {
		t.Fatalf("view after created and an unknown type: %+v, want provisioning at 5", want)
	}
	checkpointIs(t, v, 6)
	rev := revision(t, v, id)

	tests := []struct {
		name   string
		batch  []events.Envelope
		writes uint64
		cp     uint64
	}{
		{"older and equal seqs, then an unknown type: no view written, the checkpoint moves", []events.Envelope{
			env(t, id, 3, events.PhaseError, &events.Exited{Generation: 1, Code: 2}),
			env(t, id, 5, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
			func() events.Envelope {
				e := env(t, id, 7, events.PhaseStopped, &events.Deleted{})
				e.Type = "sandbox.from_the_future"
				return e
			}(),
		}, 0, 7},
		{"everything already applied: no write at all", []events.Envelope{
			env(t, id, 5, events.PhaseProvisioning, created(id, nil)),
			unknown,
		}, 0, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := streamLast(t, v)
			applyBatch(t, v, tc.batch...)
			if got := streamLast(t, v) - before; got != tc.writes {
				t.Errorf("writes = %d, want %d", got, tc.writes)
			}
			sameView(t, get(t, v, id), want)
			if got := revision(t, v, id); got != rev {
				t.Errorf("view revision %d, want %d (no write)", got, rev)
			}
			checkpointIs(t, v, tc.cp)
		})
	}

	// A writer with an empty cache reads the view back and skips them too.
	applyBatch(t, newView(t, v.js), tests[0].batch...)
	sameView(t, get(t, v, id), want)
}

func TestApplyBatchRefuses(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	for name, e := range map[string]events.Envelope{
		"no seq":                 env(t, id, 0, events.PhaseProvisioning, created(id, nil)),
		"invalid id":             env(t, "a*b", 1, events.PhaseProvisioning, created("a*b-x", nil)),
		"the old checkpoint key": env(t, legacyKey, 1, events.PhaseProvisioning, created("checkpoint", nil)),
	} {
		if err := v.ApplyBatch(context.Background(), []events.Envelope{e}); err == nil {
			t.Errorf("ApplyBatch with %s = nil, want an error", name)
		}
	}
}

func TestCheckpointSurvivesRestart(t *testing.T) {
	srv := natstest.Start(t)
	dir := srv.Dir
	v := newView(t, srv.JS)
	checkpointIs(t, v, 0)
	log := randomLog(t, 3, 20, 200)
	applyBatch(t, v, log[:120]...)
	checkpointIs(t, v, 120)
	applyBatch(t, v, log[120:]...)
	checkpointIs(t, v, 200)

	// A new writer on the same bucket starts where the old one stood ...
	w := newView(t, srv.JS)
	checkpointIs(t, w, 200)
	// ... and so does one after a restart of the server.
	srv.Stop()
	srv = natstest.StartWith(t, natstest.Options{Dir: dir})
	w = newView(t, srv.JS)
	checkpointIs(t, w, 200)
	id := log[0].SandboxID
	applyBatch(t, w, env(t, id, 205, events.PhaseStopping, &events.ForwardClosed{ForwardID: "f"}))
	checkpointIs(t, w, 205)
	if got := get(t, w, id); got.Seq != 205 || got.Name == "" {
		t.Errorf("view after restart: %+v, want stopping at 205 with its name", got)
	}
}

func TestCheckpointOfBucketWithoutKey(t *testing.T) {
	// A bucket written before the checkpoint key existed: Checkpoint scans.
	v := newView(t, natstest.Start(t).JS)
	for seq, id := range map[uint64]string{4: newID(t), 9: newID(t)} {
		view := events.View{ID: id, Phase: events.PhaseReady, Seq: seq}
		data, _ := json.Marshal(view)
		if _, err := v.kv.Put(context.Background(), id, data); err != nil {
			t.Fatalf("put: %v", err)
		}
	}
	checkpointIs(t, v, 9)
}

func TestApplyBatchErrorDropsCache(t *testing.T) {
	srv := natstest.Start(t)
	v := newView(t, srv.JS)
	a, b, c := newID(t), newID(t), newID(t)
	applyBatch(t, v, env(t, a, 1, events.PhaseProvisioning, created(a, nil)),
		env(t, b, 2, events.PhaseProvisioning, created(b, nil)))
	if cached(v, a) == false || cached(v, b) == false {
		t.Fatal("views of the first batch are not cached")
	}
	if err := srv.JS.DeleteKeyValue(context.Background(), v.cfg.Bucket); err != nil {
		t.Fatalf("delete bucket: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := v.ApplyBatch(ctx, []events.Envelope{
		env(t, a, 3, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
		env(t, c, 4, events.PhaseProvisioning, created(c, nil)),
	})
	if err == nil {
		t.Fatal("ApplyBatch on a deleted bucket = nil, want an error")
	}
	if cached(v, a) || cached(v, c) {
		t.Error("views of the failed batch are still cached; a retry would not reload them")
	}
}

func cached(v *View, id string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.cache[id]
	return ok
}

func TestConcurrentBatchWriters(t *testing.T) {
	js := natstest.Start(t).JS
	a, b := newView(t, js), newView(t, js)
	id := newID(t)
	applyBatch(t, a, env(t, id, 1, events.PhaseProvisioning, created(id, nil)))
	applyBatch(t, b, env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	// a's cached revisions (view and checkpoint) are stale now: it reloads.
	applyBatch(t, a, env(t, id, 3, events.PhaseStopping, &events.StopRequested{Generation: 1}))
	if got := get(t, a, id); got.Phase != events.PhaseStopping || got.Seq != 3 {
		t.Errorf("phase %q seq %d, want stopping 3", got.Phase, got.Seq)
	}
	checkpointIs(t, a, 3)
	// A redelivered creation of a sandbox a has not cached is written
	// conditionally and reloaded, never overwriting the newer view.
	applyBatch(t, newView(t, js), env(t, id, 1, events.PhaseProvisioning, created(id, nil)))
	if got := get(t, a, id); got.Seq != 3 {
		t.Errorf("after a redelivered creation: seq %d, want 3", got.Seq)
	}
}

func TestRebuildEqualsLiveProjection(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	log := randomLog(t, 4, 300, 4000)
	store := storeWith(t, srv.JS, log)
	last := uint64(len(log))

	live := newView(t, srv.JS)
	r, err := projections.NewRunner(store, live, projections.Config{BatchSize: 500})
	if err != nil {
		t.Fatalf("runner: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitCheckpoint(t, live, last)

	stats, err := Rebuild(ctx, srv.JS, store, Config{Bucket: "torpor_phases_rebuild"})
	if err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	known := 0 // the replay leaves out the events of unknown types, as foreign
	for _, env := range log {
		if events.Known(env.Type) {
			known++
		}
	}
	if stats.Events != known || stats.LastSeq != last || stats.Views != 300 {
		t.Errorf("stats %+v, want %d events, last seq %d, 300 views", stats, known, last)
	}
	rebuilt := newBucket(t, srv.JS, "torpor_phases_rebuild")
	sameBucket(t, live, rebuilt)
	checkpointIs(t, rebuilt, last)

	if _, err := Rebuild(ctx, srv.JS, store, Config{Bucket: "torpor_phases_rebuild"}); err == nil {
		t.Error("Rebuild into a bucket that holds views = nil, want an error")
	}
	if _, err := Rebuild(ctx, srv.JS, store, Config{}); err == nil {
		t.Error("Rebuild without a bucket name = nil, want an error")
	}
}

func TestRebuildEmptyLog(t *testing.T) {
	srv := natstest.Start(t)
	store, err := jsstore.New(context.Background(), srv.JS, jsstore.Config{})
	if err != nil {
		t.Fatalf("store: %v", err)
	}
	stats, err := Rebuild(context.Background(), srv.JS, store, Config{Bucket: "empty_rebuild"})
	if err != nil || stats.Events != 0 || stats.Views != 0 || stats.LastSeq != 0 {
		t.Errorf("Rebuild of an empty log = %+v, %v; want nothing", stats, err)
	}
}

// waitCheckpoint waits until v's checkpoint reaches seq.
func waitCheckpoint(t *testing.T, v *View, seq uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := v.pos.Watch(ctx, v.cpKey)
	if err != nil {
		t.Fatalf("watch checkpoint: %v", err)
	}
	defer stop(w)
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			if string(e.Value()) == strconv.FormatUint(seq, 10) {
				return
			}
		case <-ctx.Done():
			cp, _ := v.Checkpoint(context.Background())
			t.Fatalf("checkpoint at %d, want %d", cp, seq)
		}
	}
}

// TestCheckpointEveryHoldsBackAndFlushes: with CheckpointEvery the
// checkpoint is written at most that often, never ahead of the views, and
// Flush writes the rest; a new writer then starts from everything applied.
func TestCheckpointEveryHoldsBackAndFlushes(t *testing.T) {
	srv := natstest.Start(t)
	v, err := New(context.Background(), srv.JS, Config{CheckpointEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	log := randomLog(t, 3, 20, 200)
	applyBatch(t, v, log[:50]...)
	applyBatch(t, v, log[50:]...)
	// The first batch wrote the key; the second is held back for an hour.
	w := newView(t, srv.JS)
	checkpointIs(t, w, 50)
	if err := v.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	w = newView(t, srv.JS)
	checkpointIs(t, w, 200)
	if err := v.Flush(context.Background()); err != nil { // nothing left: no write
		t.Fatal(err)
	}
	if _, err := New(context.Background(), srv.JS, Config{CheckpointEvery: -time.Second}); err == nil {
		t.Fatal("a negative CheckpointEvery was accepted")
	}
}

// TestAPutNeverAnsweredEndsTheBatch: a write whose acknowledgement never
// comes (its stream's leader died under it: no answer and no error) fails
// the batch, UNAVAILABLE, after AckTimeout, for the runner to try again,
// rather than holding the writer until the caller's deadline. The stream
// is made silent here by deleting it and catching its subjects with a
// plain subscriber that answers nothing.
func TestAPutNeverAnsweredEndsTheBatch(t *testing.T) {
	silentBatch(t, "silent", false, "$KV.silent.>")
}

// silentBatch applies one event to a view on bucket, whose stream is then
// deleted and whose subjects are caught by a plain subscriber that answers
// nothing (forget: the next batch reads the view from the bucket), and
// fails t unless the next batch fails UNAVAILABLE after the view's
// AckTimeout, well before its caller's 20 s deadline.
func silentBatch(t *testing.T, bucket string, forget bool, subjects ...string) {
	t.Helper()
	srv := natstest.Start(t)
	v, err := New(context.Background(), srv.JS, Config{Bucket: bucket, AckTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	id := newID(t)
	applyBatch(t, v, env(t, id, 1, events.PhaseProvisioning, created(id, nil)))
	if forget {
		v.forget(id)
	}
	if err := srv.JS.DeleteStream(context.Background(), "KV_"+bucket); err != nil {
		t.Fatal(err)
	}
	for _, subj := range subjects {
		sub, err := srv.Conn.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = v.ApplyBatch(ctx, []events.Envelope{env(t, id, 2, events.PhaseProvisioning, events.Started{Generation: 1})})
	if code := events.CodeOf(err); code != events.CodeUnavailable || ctx.Err() != nil {
		t.Fatalf("ApplyBatch on the silent bucket %s: %v (code %s, caller's deadline passed: %v); want UNAVAILABLE before the caller's deadline", bucket, err, code, ctx.Err() != nil)
	}
}

// TestAReadNeverAnsweredEndsTheBatch: a read of the writer's whose answer
// never comes (its server died under it) fails after AckTimeout,
// UNAVAILABLE, also under a caller's long deadline (the hold timer's 30 s),
// rather than holding the writer, and the view, until that deadline. The
// bucket is made silent here by deleting its stream and catching its get
// requests with a plain subscriber that answers nothing.
func TestAReadNeverAnsweredEndsTheBatch(t *testing.T) {
	silentBatch(t, "mute", true, "$JS.API.DIRECT.GET.KV_mute.>", "$JS.API.STREAM.MSG.GET.KV_mute")
}
