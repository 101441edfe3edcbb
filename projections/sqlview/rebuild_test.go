package sqlview

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/events/storetest"
	"github.com/torpor/torpor/projections"
)

// publishedLog is a fresh JetStream log holding envs at sequences 1 to
// len(envs), written as jsstore.Append writes (subject, body, headers) but
// pipelined and without the concurrency check, so that a long log is
// written quickly.
func publishedLog(tb testing.TB, envs []events.Envelope) *jsstore.Store {
	tb.Helper()
	js := natstest.Start(tb).JS
	store, err := jsstore.New(context.Background(), js, jsstore.Config{})
	if err != nil {
		tb.Fatalf("store: %v", err)
	}
	const window = 2000
	futures := make([]jetstream.PubAckFuture, 0, window)
	settle := func(base int) {
		for i, f := range futures {
			select {
			case ack := <-f.Ok():
				if ack.Sequence != uint64(base+i+1) {
					tb.Fatalf("event %d stored at %d (publish to a fresh stream)", base+i, ack.Sequence)
				}
			case err := <-f.Err():
				tb.Fatalf("publish %d: %v", base+i, err)
			}
		}
		futures = futures[:0]
	}
	for i, env := range envs {
		body, err := json.Marshal(env)
		if err != nil {
			tb.Fatalf("encode: %v", err)
		}
		msg := &nats.Msg{Subject: jsstore.Subject(env.SandboxID), Data: body, Header: nats.Header{
			jetstream.MsgIDHeader: []string{env.DedupID()},
			jsstore.HeaderType:    []string{env.Type},
		}}
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			tb.Fatalf("publish %d: %v", i, err)
		}
		futures = append(futures, f)
		if len(futures) == window {
			settle(i + 1 - window)
		}
	}
	settle(len(envs) - len(futures))
	return store
}

// indexNames are the names of the indexes of the contract's tables.
func (d *db) indexNames(t *testing.T) string {
	t.Helper()
	rs, err := d.admin.Query(context.Background(), `SELECT tablename || ' ' || indexname FROM pg_indexes
WHERE schemaname = current_schema() ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return strings.Join(out, "\n")
}

// tables are the tables of d's schema.
func (d *db) tables(t *testing.T) []string {
	t.Helper()
	rs, err := d.admin.Query(context.Background(), `SELECT table_name FROM information_schema.tables
WHERE table_schema = current_schema() ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// rebuildEvents and rebuildSandboxes are the size of the equivalence test's
// log (issue 14: at least 100k events over 10k sandboxes).
const (
	rebuildEvents    = 100_000
	rebuildSandboxes = 10_000
)

// TestRebuildEquivalence: for a log of 100k events over 10k sandboxes, the
// tables a rebuild swaps in equal, row for row, the tables the live
// projection wrote (history, parked events and checkpoint included), under
// the same table and index names; nothing of the rebuild stays behind.
func TestRebuildEquivalence(t *testing.T) {
	d := newDB(t)
	envs := envelopes(t, append(lifecycle(t), randomScript(t, 21, rebuildSandboxes, rebuildEvents)...))
	// An event whose data does not decode: parked by both.
	bad := envs[40]
	bad.Data = json.RawMessage(`{"generation":"x"}`)
	envs[40] = bad
	store := publishedLog(t, envs)
	last := envs[len(envs)-1].Seq

	// The live view, written from the log by the projection's own apply in
	// batches of a few thousand events (the runner's batches are smaller,
	// which only takes longer, notably under -race).
	v := d.view(t, DefaultName, nil)
	var batch []events.Envelope
	end, err := store.Replay(context.Background(), 1, func(envs []events.Envelope) error {
		if batch = append(batch, envs...); len(batch) >= 5000 {
			err := v.ApplyBatch(context.Background(), batch)
			batch = batch[:0]
			return err
		}
		return nil
	})
	if err == nil {
		err = v.ApplyBatch(context.Background(), batch)
	}
	if err != nil || end != last {
		t.Fatalf("the live view: replay to %d: %v", end, err)
	}
	live, indexes, tables := d.dump(t), d.indexNames(t), d.tables(t)
	if v.Parked() == 0 {
		t.Fatal("the live view parked nothing; the test wants a parked event")
	}

	var phases []string
	st, err := v.Rebuild(context.Background(), store, projections.RebuildOptions{Progress: func(p projections.Progress) {
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
	}})
	if err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	t.Logf("rebuild: %+v", st)
	if st.LastSeq != last || st.Rows != d.count(t, `SELECT count(*) FROM torpor_sandboxes`) {
		t.Errorf("stats %+v: want last seq %d", st, last)
	}
	if got, want := strings.Join(phases, ","), "fold,write,catchup,swap,done"; got != want && got != "fold,write,swap,done" {
		t.Errorf("phases %s, want %s", got, want)
	}
	sameDump(t, d.dump(t), live)
	if got := d.indexNames(t); got != indexes {
		t.Errorf("indexes after the swap:\n%s\nwant\n%s", got, indexes)
	}
	if got := d.tables(t); strings.Join(got, " ") != strings.Join(tables, " ") {
		t.Errorf("tables after the swap %v, want %v", got, tables)
	}
}

// TestRebuildUnderLiveTraffic: while commands append to the log and the
// live projection applies them, a rebuild swaps its tables in; readers
// polling Get and List all along never miss a sandbox nor see one go back
// in seq, and once the traffic stops and the live projection has caught
// up, the tables equal a fresh projection of the whole log: no event was
// lost or applied twice across the swap.
func TestRebuildUnderLiveTraffic(t *testing.T) {
	d := newDB(t)
	envs := envelopes(t, randomScript(t, 5, 2000, 20000))
	store := publishedLog(t, envs)
	ctx := context.Background()

	v := d.view(t, DefaultName, nil)
	r, err := projections.NewRunner(store, v, projections.Config{BatchSize: 200, Attempts: 1 << 20, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	caughtUp(t, v, envs[len(envs)-1].Seq)

	// The sandboxes there are before the rebuild, and the first page.
	heads := map[string]uint64{}
	for _, env := range envs {
		heads[env.SandboxID] = env.Seq
	}
	ids := make([]string, 0, len(heads))
	for id := range heads {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	first, err := v.List(ctx, Query{Limit: 50})
	if err != nil {
		t.Fatal(err)
	}

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var appended atomic.Int64
	wg.Go(func() { storetest.AppendTraffic(t, trafficCtx, store, ids, heads, &appended) })

	var swapped atomic.Bool
	var polls, after atomic.Int64
	pollCtx, stopPolls := context.WithCancel(ctx)
	for w := range 3 {
		wg.Go(func() {
			seen := map[string]uint64{}
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			for pollCtx.Err() == nil {
				id := ids[rnd.IntN(len(ids))]
				got, err := v.Get(pollCtx, id)
				if pollCtx.Err() != nil {
					return
				}
				if err != nil {
					t.Errorf("Get %s during the rebuild: %v", id, err)
					return
				}
				if got.Seq < seen[id] {
					t.Errorf("Get %s: seq %d after %d: the view went back", id, got.Seq, seen[id])
					return
				}
				seen[id] = got.Seq
				page, err := v.List(pollCtx, Query{Limit: 50})
				if pollCtx.Err() != nil {
					return
				}
				if err != nil {
					t.Errorf("List during the rebuild: %v", err)
					return
				}
				if len(page.Items) != len(first.Items) {
					t.Errorf("List during the rebuild: %d items, want %d", len(page.Items), len(first.Items))
					return
				}
				for i, it := range page.Items {
					if it.ID != first.Items[i].ID {
						t.Errorf("List during the rebuild: item %d is %s, want %s", i, it.ID, first.Items[i].ID)
						return
					}
					if it.Seq < seen[it.ID] {
						t.Errorf("List: %s at seq %d after %d: the view went back", it.ID, it.Seq, seen[it.ID])
						return
					}
					seen[it.ID] = it.Seq
				}
				polls.Add(1)
				if swapped.Load() {
					after.Add(1)
				}
			}
		})
	}

	st, err := v.Rebuild(ctx, store, projections.RebuildOptions{})
	if err != nil {
		stopTraffic()
		stopPolls()
		wg.Wait()
		t.Fatalf("Rebuild: %v", err)
	}
	swapped.Store(true)
	before := appended.Load()
	eventually(t, "traffic and polls after the swap", func() (bool, error) {
		return after.Load() > 20 && appended.Load() > before+20, nil
	})
	stopTraffic()
	stopPolls()
	wg.Wait()
	t.Logf("rebuild %+v; %d polls, %d after the swap; %d events appended meanwhile", st, polls.Load(), after.Load(), appended.Load())
	if appended.Load() == before {
		t.Fatal("no traffic during the rebuild")
	}

	lastSeq, err := store.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	caughtUp(t, v, lastSeq)
	stop()
	fresh := newDB(t)
	fv := fresh.view(t, DefaultName, nil)
	fr, err := projections.NewRunner(store, fv, projections.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stopFresh := run(t, fr)
	caughtUp(t, fv, lastSeq)
	stopFresh()
	sameDump(t, d.dump(t), fresh.dump(t))
}

// TestRebuildUntil: a rebuild until a sequence, or until a time (the last
// sequence at or before it), builds torpor_sandboxes_at_<seq> and
// torpor_history_at_<seq> equal to a projection of the log up to there,
// leaves the live tables as they were, and a second build of the same past
// is ALREADY_EXISTS; an until past the log's end is INVALID_ARGUMENT.
func TestRebuildUntil(t *testing.T) {
	d := newDB(t)
	envs := envelopes(t, append(lifecycle(t), randomScript(t, 3, 40, 3000)...))
	store := publishedLog(t, envs)
	ctx := context.Background()
	v := d.view(t, DefaultName, nil)
	applyIn(t, v, envs, 500)
	live := d.dump(t)

	rows := func(db *db, table, order string) string {
		t.Helper()
		rs, err := db.admin.Query(ctx, `SELECT x::text FROM `+ident(table)+` x ORDER BY `+order)
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		var sb strings.Builder
		for rs.Next() {
			var s string
			if err := rs.Scan(&s); err != nil {
				t.Fatal(err)
			}
			sb.WriteString(s + "\n")
		}
		return sb.String()
	}
	for _, c := range []struct {
		name string
		opts projections.RebuildOptions
		seq  uint64
	}{
		{"a sequence", projections.RebuildOptions{Until: 1234}, 1234},
		{"a time", projections.RebuildOptions{UntilTime: envs[2000-1].Time.Add(500 * time.Millisecond)}, 2000},
		{"the last sequence", projections.RebuildOptions{Until: uint64(len(envs))}, uint64(len(envs))},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := v.Rebuild(ctx, store, c.opts)
			if err != nil {
				t.Fatalf("Rebuild: %v", err)
			}
			s, h := PastTables(c.seq)
			if st.LastSeq != c.seq || st.Sandboxes != s || st.History != h {
				t.Errorf("stats %+v, want seq %d in %s and %s", st, c.seq, s, h)
			}
			want := newDB(t)
			applyIn(t, want.view(t, DefaultName, nil), envs[:c.seq], 700)
			if got, w := rows(d, s, "id"), rows(want, "torpor_sandboxes", "id"); got != w {
				sameDump(t, got, w)
			}
			if got, w := rows(d, h, "seq"), rows(want, "torpor_history", "seq"); got != w {
				sameDump(t, got, w)
			}
			sameDump(t, d.dump(t), live)

			_, err = v.Rebuild(ctx, store, c.opts)
			if code := events.AsError(err).Code; code != events.CodeAlreadyExists {
				t.Errorf("second Rebuild: %v (%s), want ALREADY_EXISTS", err, code)
			}
		})
	}
	_, err := v.Rebuild(ctx, store, projections.RebuildOptions{Until: uint64(len(envs)) + 1})
	if code := events.AsError(err).Code; code != events.CodeInvalidArgument {
		t.Errorf("Rebuild past the end: %v (%s), want INVALID_ARGUMENT", err, code)
	}
	_, err = v.Rebuild(ctx, store, projections.RebuildOptions{UntilTime: envs[0].Time.Add(-time.Second)})
	if code := events.AsError(err).Code; code != events.CodeInvalidArgument {
		t.Errorf("Rebuild before the first event: %v (%s), want INVALID_ARGUMENT", err, code)
	}
	for _, table := range d.tables(t) {
		if strings.Contains(table, "rebuild") {
			t.Errorf("table %s left behind", table)
		}
	}
}
