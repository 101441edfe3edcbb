package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections/kvview"
)

// kvViews serves the HTTP API's reads from a KV view, as serve does.
type kvViews struct{ v *kvview.View }

func (k kvViews) Get(ctx context.Context, id string) (events.View, error) { return k.v.Get(ctx, id) }
func (k kvViews) List(ctx context.Context, q ListQuery) (events.Page, error) {
	return k.v.List(ctx, kvview.Query{Phase: q.Phase, Label: q.Label, Name: q.Name, Driver: q.Driver, Node: q.Node,
		Sort: q.Sort, Limit: q.Limit, Cursor: q.Cursor})
}
func (k kvViews) Wait(ctx context.Context, id string, p events.Phase, after uint64) (events.View, error) {
	return k.v.Wait(ctx, id, p, after)
}
func (k kvViews) Settle(ctx context.Context, id string, after uint64) (events.View, error) {
	return k.v.Settle(ctx, id, after)
}
func (k kvViews) Counts(ctx context.Context) (map[events.Phase]int, error) { return k.v.Counts(ctx) }
func (k kvViews) Watch(ctx context.Context, after uint64) (<-chan events.View, error) {
	return k.v.Watch(ctx, after)
}

var _ Views = kvViews{}

// listBody is the body of GET /v1/sandboxes, or of its error.
type listBody struct {
	Items []events.View `json:"items"`
	Next  *string       `json:"next"`
	Total *int          `json:"total"`
	Error *events.Error `json:"error"`
}

// TestHTTPListFiltersSortsAndRefuses: GET /v1/sandboxes takes name, driver,
// node and sort beside phase, label, limit and cursor (CONTRACT §5), says
// the total of matches, pages a sort with its cursor, answers an old query
// as before (creation order, the last id as the cursor), and refuses an
// unknown sort, a cursor of another sort and a malformed cursor with
// INVALID_ARGUMENT.
func TestHTTPListFiltersSortsAndRefuses(t *testing.T) {
	ctx := context.Background()
	v, err := kvview.New(ctx, natstest.Start(t).JS, kvview.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 4)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7()).String()
	}
	slices.Sort(ids)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, c := range []events.Created{
		{Name: "web-b", Driver: "sim", Node: "n1", Generation: 1},
		{Name: "db", Driver: "process", Node: "n1", Generation: 1},
		{Name: "web-a", Driver: "sim", Node: "n2", Generation: 1},
		{Name: "Web-c", Driver: "sim", Node: "n1", Generation: 1}, // a name from the log, whatever its case
	} {
		env, err := events.NewEnvelope(ids[i], &c, events.Meta{Actor: "test"}, t0.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		env.Seq, env.Phase = uint64(i+1), events.PhaseProvisioning
		if err := v.Apply(ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(NewHTTP(nil, kvViews{v}, nil, zerolog.Nop()))
	t.Cleanup(srv.Close)
	get := func(t *testing.T, query string) (int, listBody) {
		t.Helper()
		res, err := http.Get(srv.URL + "/v1/sandboxes?" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b listBody
		if err := json.NewDecoder(res.Body).Decode(&b); err != nil {
			t.Fatalf("%s: body: %v", query, err)
		}
		return res.StatusCode, b
	}
	// every pages through query, limit 1, and returns the ids in order.
	every := func(t *testing.T, query string) []string {
		t.Helper()
		out := []string{}
		cursor := ""
		for range len(ids) + 1 {
			code, b := get(t, query+"&limit=1&cursor="+url.QueryEscape(cursor))
			if code != http.StatusOK || b.Next == nil || b.Total == nil {
				t.Fatalf("%s: %d %+v, want 200 with next and total", query, code, b)
			}
			for _, it := range b.Items {
				out = append(out, it.ID)
			}
			if cursor = *b.Next; cursor == "" {
				return out
			}
		}
		t.Fatalf("%s: paging does not end", query)
		return nil
	}

	t.Run("an old query answers as before", func(t *testing.T) {
		code, b := get(t, "limit=2")
		if code != http.StatusOK || len(b.Items) != 2 || b.Items[0].ID != ids[0] || b.Items[1].ID != ids[1] {
			t.Fatalf("limit=2: %d %+v, want the first two created", code, b)
		}
		if want := base64.RawURLEncoding.EncodeToString([]byte(ids[1])); b.Next == nil || *b.Next != want {
			t.Errorf("next %v, want the last id as before: %s", b.Next, want)
		}
		if b.Total == nil || *b.Total != 4 {
			t.Errorf("total %v, want 4", b.Total)
		}
	})
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"sort=name", []string{ids[3], ids[1], ids[2], ids[0]}}, // bytes: "W" before "d"
		{"sort=-name", []string{ids[0], ids[2], ids[1], ids[3]}},
		{"sort=created&name=WEB", []string{ids[0], ids[2], ids[3]}},
		{"name=web&driver=sim&node=n1&sort=-age", []string{ids[3], ids[0]}},
		{"sort=age&node=n1", []string{ids[0], ids[1], ids[3]}},
		{"driver=process", []string{ids[1]}},
		{"name=nothing", []string{}},
	} {
		t.Run(c.query, func(t *testing.T) {
			if got := every(t, c.query); !slices.Equal(got, c.want) {
				t.Errorf("ids %v, want %v", got, c.want)
			}
			code, b := get(t, c.query)
			if code != http.StatusOK || b.Total == nil || *b.Total != len(c.want) {
				t.Errorf("total %v (%d), want %d", b.Total, code, len(c.want))
			}
		})
	}

	_, byName := get(t, "sort=name&limit=1")
	_, byAge := get(t, "sort=-age&limit=1")
	_, created := get(t, "limit=1")
	for _, query := range []string{
		"sort=size",
		"sort=NAME",
		"sort=age&cursor=" + url.QueryEscape(*byName.Next),
		"sort=age&cursor=" + url.QueryEscape(*byAge.Next),
		"cursor=" + url.QueryEscape(*byAge.Next),
		"sort=name&cursor=" + url.QueryEscape(*created.Next),
		"sort=-name&cursor=" + url.QueryEscape(*byName.Next),
		"cursor=%25%25",
	} {
		code, b := get(t, query)
		if code != http.StatusBadRequest || b.Error == nil || b.Error.Code != events.CodeInvalidArgument {
			t.Errorf("%s: %d %+v, want 400 INVALID_ARGUMENT", query, code, b)
		}
	}
}
