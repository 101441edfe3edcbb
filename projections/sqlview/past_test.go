package sqlview

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/torpor/torpor/projections"
)

// TestReapPast: on a clock the test moves, a view of the past made more
// than the TTL ago is dropped (both its tables, and its record), one made
// since is kept, and so is one made by hand with no record, which is timed
// from the first reap that sees it; the live tables are never touched.
func TestReapPast(t *testing.T) {
	d := newDB(t)
	envs := envelopes(t, lifecycle(t))
	store := publishedLog(t, envs)
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v, err := New(ctx, d.pool(t, "past", nil), Config{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	applyIn(t, v, envs, 100)
	live := d.dump(t)
	const ttl = time.Hour

	if _, err := v.Rebuild(ctx, store, projections.RebuildOptions{Until: 3}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * ttl)
	if _, err := v.Rebuild(ctx, store, projections.RebuildOptions{Until: 5}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE torpor_sandboxes_at_4 (LIKE torpor_sandboxes INCLUDING ALL)`,
		`CREATE TABLE torpor_history_at_4 (LIKE torpor_history INCLUDING ALL)`,
	} {
		if _, err := d.admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	past := func() []string {
		var out []string
		for _, table := range d.tables(t) {
			for _, seq := range []uint64{3, 4, 5} {
				s, h := PastTables(seq)
				if table == s || table == h {
					out = append(out, table)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	if got, want := past(), []string{"torpor_history_at_3", "torpor_history_at_4", "torpor_history_at_5", "torpor_sandboxes_at_3", "torpor_sandboxes_at_4", "torpor_sandboxes_at_5"}; !slices.Equal(got, want) {
		t.Fatalf("tables of the past before: %v, want %v", got, want)
	}

	now = now.Add(time.Minute)
	dropped, err := v.ReapPast(ctx, ttl, now)
	if err != nil {
		t.Fatalf("ReapPast: %v", err)
	}
	slices.Sort(dropped)
	if want := []string{"torpor_history_at_3", "torpor_sandboxes_at_3"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped %v, want %v (made 2h1m ago, TTL 1h)", dropped, want)
	}
	if got, want := past(), []string{"torpor_history_at_4", "torpor_history_at_5", "torpor_sandboxes_at_4", "torpor_sandboxes_at_5"}; !slices.Equal(got, want) {
		t.Errorf("tables of the past after: %v, want %v", got, want)
	}
	if n := d.count(t, `SELECT count(*) FROM torpor_past WHERE seq = 3`); n != 0 {
		t.Errorf("the record of the dropped view at 3 is still there")
	}
	sameDump(t, d.dump(t), live)

	// Within the TTL of the view at 5 (made 1 minute ago) and of the one at
	// 4 (first seen now), nothing goes; past it, both do.
	now = now.Add(ttl - 2*time.Minute)
	if dropped, err := v.ReapPast(ctx, ttl, now); err != nil || len(dropped) != 0 {
		t.Errorf("ReapPast within the TTL: dropped %v, %v; want nothing", dropped, err)
	}
	now = now.Add(3 * time.Minute)
	if _, err := v.ReapPast(ctx, ttl, now); err != nil {
		t.Fatalf("ReapPast: %v", err)
	}
	if got := past(); len(got) != 0 {
		t.Errorf("tables of the past after the TTL: %v, want none", got)
	}
	if n := d.count(t, `SELECT count(*) FROM torpor_past`); n != 0 {
		t.Errorf("%d records of views of the past left, want none", n)
	}
	sameDump(t, d.dump(t), live)
}
