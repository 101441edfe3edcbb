package sqlview

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections"
	"github.com/torpor/torpor/projections/kvview"
)

// TestSameRowsAsKV is the view contract: one log from JetStream, fed to the
// KV view and to the SQL view by the runner, gives the same view of every
// sandbox, the same list pages (filters, cursors, creation order) and the
// same phase counts; the history table holds the log's events.
func TestSameRowsAsKV(t *testing.T) {
	d := newDB(t)
	script := append(lifecycle(t), randomScript(t, 14, 25, 400)...)
	envs := envelopes(t, script)
	kv, sql, store := bothViews(t, d, envs)
	ctx := context.Background()

	ids := map[string]bool{}
	for _, env := range envs {
		ids[env.SandboxID] = true
	}
	for id := range ids {
		want, err := kv.Get(ctx, id)
		if err != nil {
			t.Fatalf("kv Get %s: %v", id, err)
		}
		got, err := sql.Get(ctx, id)
		if err != nil {
			t.Fatalf("sql Get %s: %v", id, err)
		}
		sameJSON(t, "view "+id, got, want)
	}
	if _, err := sql.Get(ctx, newID(t)); !errors.Is(err, events.ErrNotFound) {
		t.Errorf("Get of a sandbox never created: %v, want ErrNotFound", err)
	}

	for _, q := range []struct {
		name  string
		phase events.Phase
		label string
		limit int
	}{
		{"all", "", "", 0},
		{"pages of 7", "", "", 7},
		{"label", "", "team=x", 0},
		{"label in pages", "", "team=1", 3},
		{"phase", events.PhaseReady, "", 2},
		{"phase and label", events.PhaseError, "team=2", 1},
		{"no such label", "", "team=nobody", 0},
	} {
		t.Run(q.name, func(t *testing.T) {
			kq := kvview.Query{Phase: q.phase, Label: q.label, Limit: q.limit}
			sq := Query{Phase: q.phase, Label: q.label, Limit: q.limit}
			for page := 0; ; page++ {
				want, err := kv.List(ctx, kq)
				if err != nil {
					t.Fatalf("kv List: %v", err)
				}
				got, err := sql.List(ctx, sq)
				if err != nil {
					t.Fatalf("sql List: %v", err)
				}
				sameJSON(t, "page", got, want)
				if want.Next == "" || got.Next == "" || page > 200 {
					break
				}
				kq.Cursor, sq.Cursor = want.Next, got.Next
			}
		})
	}
	for _, bad := range []Query{{Cursor: "%%"}, {Label: "nokey"}, {Phase: "sleeping"}, {Limit: -1}} {
		_, kerr := kv.List(ctx, kvview.Query{Phase: bad.Phase, Label: bad.Label, Limit: bad.Limit, Cursor: bad.Cursor})
		_, serr := sql.List(ctx, bad)
		if events.CodeOf(serr) != events.CodeInvalidArgument || events.CodeOf(kerr) != events.CodeOf(serr) {
			t.Errorf("List(%+v): sql %v, kv %v; want INVALID_ARGUMENT from both", bad, serr, kerr)
		}
	}

	wantCounts, err := kv.Counts(ctx)
	if err != nil {
		t.Fatalf("kv Counts: %v", err)
	}
	gotCounts, err := sql.Counts(ctx)
	if err != nil {
		t.Fatalf("sql Counts: %v", err)
	}
	sameJSON(t, "counts", gotCounts, wantCounts)

	for id := range ids {
		want, err := store.Load(ctx, id, 0)
		if err != nil {
			t.Fatalf("Load %s: %v", id, err)
		}
		got, err := sql.History(ctx, id, 0)
		if err != nil {
			t.Fatalf("History %s: %v", id, err)
		}
		sameJSON(t, "history of "+id, entries(t, got), entries(t, want))
	}
	if n := d.count(t, `SELECT count(*) FROM torpor_history`); n != len(envs) {
		t.Errorf("history holds %d rows, want %d", n, len(envs))
	}
}

// entries is the history as the HTTP API shows it, with data re-encoded so
// that JSONB's key order and spacing do not count.
func entries(t *testing.T, envs []events.Envelope) []events.HistoryEntry {
	t.Helper()
	out := make([]events.HistoryEntry, len(envs))
	for i, env := range envs {
		out[i] = env.HistoryEntry()
		var data any
		if err := json.Unmarshal(env.Data, &data); err != nil {
			t.Fatalf("data of seq %d: %v", env.Seq, err)
		}
		out[i].Data, _ = json.Marshal(data)
	}
	return out
}

// sameJSON compares got and want by their wire form.
func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	g, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if string(g) != string(w) {
		t.Errorf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// bothViews feeds envs, as a JetStream log, to a KV view and to the SQL view
// of d through the runner, and returns the two once both are at its last
// event, and the log.
func bothViews(t *testing.T, d *db, envs []events.Envelope) (*kvview.View, *View, *jsstore.Store) {
	t.Helper()
	ns := natstest.Start(t)
	store := logOf(t, envs)
	last := envs[len(envs)-1].Seq
	kv, err := kvview.New(context.Background(), ns.JS, kvview.Config{})
	if err != nil {
		t.Fatalf("kvview: %v", err)
	}
	sql := d.view(t, DefaultName, nil)
	for _, p := range []projections.Projection{kv, sql} {
		r, err := projections.NewRunner(store, p, projections.Config{BatchSize: 64})
		if err != nil {
			t.Fatalf("runner: %v", err)
		}
		run(t, r)
	}
	caughtUp(t, sql, last)
	eventually(t, "kvview at the head", func() (bool, error) {
		cp, err := kv.Checkpoint(context.Background())
		return cp >= last, err
	})
	return kv, sql, store
}
