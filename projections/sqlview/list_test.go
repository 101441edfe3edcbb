package sqlview

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections"
	"github.com/torpor/torpor/projections/kvview"
)

// lister is what the list tests ask of both views.
type lister interface {
	List(ctx context.Context, q projections.Query) (events.Page, error)
	ApplyBatch(ctx context.Context, envs []events.Envelope) error
}

// twoViews is the KV view and the SQL view, fed the same events.
type twoViews struct {
	kv  *kvview.View
	sql *View
	js  jetstream.JetStream
	seq uint64
}

func newTwoViews(t *testing.T) *twoViews {
	t.Helper()
	d := newDB(t)
	ns := natstest.Start(t)
	kv, err := kvview.New(context.Background(), ns.JS, kvview.Config{})
	if err != nil {
		t.Fatalf("kvview: %v", err)
	}
	return &twoViews{kv: kv, sql: d.view(t, DefaultName, nil), js: ns.JS}
}

// step is one event of sandbox id at second at of the test's clock, and
// the phase after it.
type step struct {
	id    string
	at    int
	phase events.Phase
	e     events.Event
}

// clock is the test's time: second s, with nanoseconds that PostgreSQL's
// microseconds do not hold.
func clock(s int) time.Time { return t0.Add(time.Duration(s)*time.Second + 123457*time.Nanosecond) }

// apply appends steps to both views, in order, at the next sequences.
func (w *twoViews) apply(t *testing.T, steps ...step) {
	t.Helper()
	envs := make([]events.Envelope, len(steps))
	for i, s := range steps {
		env, err := events.NewEnvelope(s.id, s.e, events.Meta{Actor: "test"}, clock(s.at))
		if err != nil {
			t.Fatalf("envelope: %v", err)
		}
		w.seq++
		env.Phase, env.Seq = s.phase, w.seq
		envs[i] = env
	}
	for _, v := range []lister{w.kv, w.sql} {
		if err := v.ApplyBatch(context.Background(), envs); err != nil {
			t.Fatalf("ApplyBatch: %v", err)
		}
	}
}

// sortedIDs returns n new ids in creation (byte) order.
func sortedIDs(t *testing.T, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = newID(t)
	}
	slices.Sort(ids)
	return ids
}

// all reads every page of q from v, failing t on an error; each page's
// total must be the same.
func all(t *testing.T, v lister, q projections.Query) (ids []string, pages []events.Page) {
	t.Helper()
	for {
		page, err := v.List(context.Background(), q)
		if err != nil {
			t.Fatalf("List(%+v): %v", q, err)
		}
		pages = append(pages, page)
		for _, it := range page.Items {
			ids = append(ids, it.ID)
		}
		if len(page.Items) > max(q.Limit, 1) && q.Limit > 0 {
			t.Errorf("List(%+v): a page of %d", q, len(page.Items))
		}
		if page.Next == "" || len(pages) > 100 {
			return ids, pages
		}
		q.Cursor = page.Next
	}
}

// TestListFiltersAndSorts: both views give the pages the contract (§5)
// says for each filter (phase, label, name as a substring in any case,
// driver, node) and order (creation; name, byte by byte; age in phase,
// the longest first; each reversed; ties by id), at every page size, with
// the same cursors and the number of matches over all pages; a view
// stored without phase_since is placed by its updated_at.
func TestListFiltersAndSorts(t *testing.T) {
	w := newTwoViews(t)
	s := sortedIDs(t, 9)
	created := func(i, at int, name, driver, node string, labels map[string]string) step {
		return step{s[i], at, events.PhaseProvisioning, &events.Created{Name: name, Driver: driver, Node: node, Labels: labels, Generation: 1}}
	}
	ready := func(i, at int) step {
		return step{s[i], at, events.PhaseReady, &events.SupervisorAttached{Generation: 1}}
	}
	forward := func(i, at int) step {
		return step{s[i], at, events.PhaseReady, &events.ForwardOpened{ForwardID: fmt.Sprint("f", i), Listen: "127.0.0.1:0", Address: "127.0.0.1:1", Port: 80}}
	}
	a := map[string]string{"team": "a"}
	// Each sandbox's time in its phase (phase_since) is the second noted.
	w.apply(t,
		created(0, 1, "web-1", "sim", "n1", a),
		created(1, 2, "db", "process", "n1", map[string]string{"team": "b"}), // provisioning since 2
		created(2, 3, "api-web", "sim", "n2", a),
		created(3, 4, "cache", "sim", "n2", nil),
		ready(2, 5), // ready since 5
		ready(3, 6),
		created(4, 7, "worker", "process", "n1", a),
		ready(4, 8), // ready since 8, updated at 40 below
		created(5, 9, "web-3", "sim", "n1", nil),
		step{s[5], 10, events.PhaseDeleting, &events.DeleteRequested{}},
		step{s[5], 11, events.PhaseDeleted, &events.Deleted{}}, // deleted since 11
		created(6, 12, "batch", "sim", "n1", nil),
		ready(6, 13), // since 13, but stored without phase_since below: updated at 25
		created(7, 14, "web-3", "sim", "n1", nil), // the name of the deleted one
		ready(7, 15), // since 15
		created(8, 16, "zz", "sim", "n1", nil),
		ready(0, 20), // since 20
		ready(8, 20), // since 20 too: after s[0] by id
		forward(6, 25),
		step{s[3], 30, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}},
		step{s[3], 31, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "r"}}, // since 31
		forward(4, 40),
	)
	stripPhaseSince(t, w, s[6])

	ids := func(is ...int) []string {
		out := []string{}
		for _, i := range is {
			out = append(out, s[i])
		}
		return out
	}
	cases := []struct {
		name string
		q    projections.Query
		want []string
	}{
		{"everything in creation order", projections.Query{}, ids(0, 1, 2, 3, 4, 5, 6, 7, 8)},
		{"sort created says the same", projections.Query{Sort: "created"}, ids(0, 1, 2, 3, 4, 5, 6, 7, 8)},
		{"by name, ties by id", projections.Query{Sort: "name"}, ids(2, 6, 3, 1, 0, 5, 7, 4, 8)},
		{"by name reversed", projections.Query{Sort: "-name"}, ids(8, 4, 7, 5, 0, 1, 3, 6, 2)},
		{"longest in phase first, ties by id", projections.Query{Sort: "age"}, ids(1, 2, 4, 5, 7, 0, 8, 6, 3)},
		{"newest in phase first", projections.Query{Sort: "-age"}, ids(3, 6, 8, 0, 7, 5, 4, 2, 1)},
		{"name in another case", projections.Query{Name: "WEB"}, ids(0, 2, 5, 7)},
		{"name by name", projections.Query{Name: "web", Sort: "name"}, ids(2, 0, 5, 7)},
		{"name in the middle", projections.Query{Name: "b-"}, ids(0, 5, 7)},
		{"driver", projections.Query{Driver: "process"}, ids(1, 4)},
		{"node", projections.Query{Node: "n2"}, ids(2, 3)},
		{"phase, newest in phase first", projections.Query{Phase: events.PhaseReady, Sort: "-age"}, ids(6, 8, 0, 7, 4, 2)},
		{"label by name", projections.Query{Label: "team=a", Sort: "name"}, ids(2, 0, 4)},
		{"node, driver and name", projections.Query{Node: "n1", Driver: "sim", Name: "web"}, ids(0, 5, 7)},
		{"name that nothing has", projections.Query{Name: "nomatch", Sort: "age"}, ids()},
		{"driver that nothing has", projections.Query{Driver: "vm"}, ids()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, limit := range []int{0, 1, 2, 4} {
				q := c.q
				q.Limit = limit
				kvIDs, kvPages := all(t, w.kv, q)
				sqlIDs, sqlPages := all(t, w.sql, q)
				for what, got := range map[string][]string{"kv": kvIDs, "sql": sqlIDs} {
					if !slices.Equal(orEmpty(got), c.want) {
						t.Errorf("%s, limit %d: ids %v, want %v", what, limit, got, c.want)
					}
				}
				for _, p := range append(kvPages, sqlPages...) {
					if p.Total != len(c.want) {
						t.Errorf("limit %d: total %d, want %d", limit, p.Total, len(c.want))
					}
				}
				sameJSON(t, fmt.Sprintf("pages of %d, sql and kv", limit), sqlPages, kvPages)
			}
		})
	}
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// stripPhaseSince makes id's view one an older build stored: no
// phase_since in the bucket, NULL in the table.
func stripPhaseSince(t *testing.T, w *twoViews, id string) {
	t.Helper()
	ctx := context.Background()
	view, err := w.kv.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	view.PhaseSince = time.Time{}
	b, err := json.Marshal(view)
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := w.js.KeyValue(ctx, "torpor_phases")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Put(ctx, id, b); err != nil {
		t.Fatal(err)
	}
	if _, err := w.sql.pool.Exec(ctx, `UPDATE torpor_sandboxes SET phase_since = NULL, phase_since_nanos = 0 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	for _, v := range []lister{w.kv, w.sql} {
		page, err := v.List(ctx, projections.Query{Name: view.Name})
		if err != nil || len(page.Items) != 1 || !page.Items[0].PhaseSince.IsZero() {
			t.Fatalf("List(name %s) = %+v, %v: want its view without phase_since", view.Name, page, err)
		}
	}
}

// TestListRefusesWithBothViews: an unknown sort, and a cursor used with
// another sort than the one it came from, are INVALID_ARGUMENT from both
// views, as a malformed cursor is.
func TestListRefusesWithBothViews(t *testing.T) {
	w := newTwoViews(t)
	s := sortedIDs(t, 3)
	for i, id := range s {
		w.apply(t, step{id, i, events.PhaseProvisioning, &events.Created{Name: fmt.Sprint("n", i), Driver: "sim", Node: "n1", Generation: 1}})
	}
	ctx := context.Background()
	cursor := func(sort string) string {
		page, err := w.kv.List(ctx, projections.Query{Sort: sort, Limit: 1})
		if err != nil || page.Next == "" {
			t.Fatalf("List(sort %q, limit 1) = %+v, %v: want a next page", sort, page, err)
		}
		return page.Next
	}
	for _, q := range []projections.Query{
		{Sort: "size"},
		{Sort: "Name"},
		{Sort: "+age"},
		{Sort: "name", Cursor: cursor("")},
		{Sort: "-name", Cursor: cursor("name")},
		{Sort: "age", Cursor: cursor("name")},
		{Cursor: cursor("age")},
		{Sort: "created", Cursor: cursor("-age")},
		{Sort: "age", Cursor: cursor("-age")},
	} {
		for what, v := range map[string]lister{"kv": w.kv, "sql": w.sql} {
			if _, err := v.List(ctx, q); events.CodeOf(err) != events.CodeInvalidArgument {
				t.Errorf("%s List(sort %q, cursor %q) = %v, want INVALID_ARGUMENT", what, q.Sort, q.Cursor, err)
			}
		}
	}
}

// TestListPagesWhileViewsChange: paging through a sorted list while
// sandboxes are created and others change (in ways that leave their place
// in the order) visits every sandbox that was there before exactly once,
// in order, in both views; a new one comes at most once.
func TestListPagesWhileViewsChange(t *testing.T) {
	for _, sort := range []string{"name", "-name", "age", "-age", "created"} {
		t.Run(sort, func(t *testing.T) {
			w := newTwoViews(t)
			const n = 20
			s := sortedIDs(t, n)
			var steps []step
			for i, id := range s {
				// Names in another order than the ids; times too.
				steps = append(steps, step{id, 100 + (i*7)%n, events.PhaseProvisioning,
					&events.Created{Name: fmt.Sprintf("box-%02d", (i*13)%n), Driver: "sim", Node: "n1", Generation: 1}},
					step{id, 100 + (i*7)%n, events.PhaseReady, &events.SupervisorAttached{Generation: 1}})
			}
			w.apply(t, steps...)
			before := map[string]bool{}
			for _, id := range s {
				before[id] = true
			}
			for what, v := range map[string]lister{"kv": w.kv, "sql": w.sql} {
				q := projections.Query{Sort: sort, Limit: 3}
				seen := map[string]int{}
				at := 200
				var got []events.View
				for pages := 0; ; pages++ {
					if pages > 3*n {
						t.Fatalf("%s: paging does not end", what)
					}
					page, err := v.List(context.Background(), q)
					if err != nil {
						t.Fatalf("%s List: %v", what, err)
					}
					for _, it := range page.Items {
						seen[it.ID]++
						got = append(got, it)
					}
					if page.Next == "" {
						break
					}
					q.Cursor = page.Next
					// Between pages: a new sandbox, and one that was there
					// gets a forward (its name and its time in phase stay).
					at++
					id := newID(t)
					old := s[pages%n]
					w.apply(t,
						step{id, at, events.PhaseProvisioning, &events.Created{Name: fmt.Sprintf("new-%02d", pages), Driver: "sim", Node: "n1", Generation: 1}},
						step{old, at, events.PhaseReady, &events.ForwardOpened{ForwardID: fmt.Sprint("f", at), Listen: "127.0.0.1:0", Address: "127.0.0.1:1", Port: 80}},
					)
				}
				for id := range before {
					if seen[id] != 1 {
						t.Errorf("%s: %s listed %d times, want once", what, id, seen[id])
					}
				}
				for id, k := range seen {
					if k > 1 {
						t.Errorf("%s: %s listed %d times", what, id, k)
					}
				}
				if p := (projections.Parsed{Sort: sort}); !slices.IsSortedFunc(got, p.Compare) {
					t.Errorf("%s: the pages are not in %s order", what, sort)
				}
			}
		})
	}
}
