package projections

import (
	"cmp"
	"encoding/base64"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/torpor/torpor/events"
)

// Page sizes of a view's List.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// The orders of a list (Query.Sort). Each breaks ties by id, so that every
// view has one place; a sort with a minus is the exact reverse of the one
// without, ties included.
const (
	// SortCreated is creation order, the order of ids (uuid v7): the
	// default, and the only order before sorts were added.
	SortCreated = "created"
	// SortName and SortNameDesc order by name, byte by byte.
	SortName     = "name"
	SortNameDesc = "-name"
	// SortAge puts the longest in its phase first: events.View.SortTime
	// ascending (phase_since, or updated_at for a view without it).
	// SortAgeDesc puts the newest in its phase first.
	SortAge     = "age"
	SortAgeDesc = "-age"
)

// Sorts are the values Query.Sort takes ("" is SortCreated).
var Sorts = []string{SortCreated, SortName, SortNameDesc, SortAge, SortAgeDesc}

// Query selects the views a view's List returns. The zero value lists
// everything, deleted sandboxes included, DefaultLimit at a time, in
// creation order.
type Query struct {
	// Phase keeps views in that phase; empty keeps all.
	Phase events.Phase
	// Label keeps views carrying label "k=v"; empty keeps all.
	Label string
	// Name keeps views whose name contains it, in any case; empty keeps all.
	Name string
	// Driver and Node keep views of that driver, on that node; empty keeps all.
	Driver, Node string
	// Sort is the order of the list, one of Sorts; empty is SortCreated.
	Sort string
	// Limit is the page size: 0 means DefaultLimit, above MaxLimit means MaxLimit.
	Limit int
	// Cursor is the Next of the previous page of the same sort; empty
	// starts at the first.
	Cursor string
}

// Parsed is a Query checked: the place its page starts after, its label
// filter split, its name filter in lower case, its sort and page size
// resolved.
type Parsed struct {
	// After is the id of the last view of the previous page, "" at the
	// first page; AfterName and AfterTime are its sort key under
	// SortName(Desc) and SortAge(Desc) (a time as Unix nanoseconds).
	After                string
	AfterName            string
	AfterTime            int64
	LabelKey, LabelValue string
	Phase                events.Phase
	Name                 string
	Driver, Node         string
	Sort                 string
	Limit                int
}

// Parse checks q as every view's List does: a malformed cursor, label,
// phase or sort, a cursor of another sort, or a negative limit is an
// INVALID_ARGUMENT error.
func (q Query) Parse() (Parsed, error) {
	sort := q.Sort
	if sort == "" {
		sort = SortCreated
	}
	if !slices.Contains(Sorts, sort) {
		return Parsed{}, events.Errorf(events.CodeInvalidArgument, "sort %q: want one of %s", q.Sort, strings.Join(Sorts, ", "))
	}
	p, err := decodeCursor(q.Cursor, sort)
	if err != nil {
		return Parsed{}, err
	}
	lk, lv, err := parseLabel(q.Label)
	if err != nil {
		return Parsed{}, err
	}
	if q.Phase != events.PhaseNone && !q.Phase.Known() {
		return Parsed{}, events.Errorf(events.CodeInvalidArgument, "phase %q: not a phase", q.Phase)
	}
	limit := q.Limit
	switch {
	case limit < 0:
		return Parsed{}, events.Errorf(events.CodeInvalidArgument, "limit %d: must not be negative", limit)
	case limit == 0:
		limit = DefaultLimit
	case limit > MaxLimit:
		limit = MaxLimit
	}
	p.LabelKey, p.LabelValue, p.Phase, p.Limit, p.Sort = lk, lv, q.Phase, limit, sort
	p.Name, p.Driver, p.Node = strings.ToLower(q.Name), q.Driver, q.Node
	return p, nil
}

// Keeps reports whether view passes p's filters: phase, label, name (a
// substring, in any case), driver and node.
func (p Parsed) Keeps(view events.View) bool {
	if p.Phase != events.PhaseNone && view.Phase != p.Phase {
		return false
	}
	if p.LabelKey != "" {
		if got, ok := view.Labels[p.LabelKey]; !ok || got != p.LabelValue {
			return false
		}
	}
	if p.Name != "" && !strings.Contains(strings.ToLower(view.Name), p.Name) {
		return false
	}
	if p.Driver != "" && view.Driver != p.Driver {
		return false
	}
	if p.Node != "" && view.Node != p.Node {
		return false
	}
	return true
}

// Compare orders a before b (-1), after b (1) or at its place (0, the same
// id) in p's sort.
func (p Parsed) Compare(a, b events.View) int {
	switch p.Sort {
	case SortName:
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID))
	case SortNameDesc:
		return cmp.Or(strings.Compare(b.Name, a.Name), strings.Compare(b.ID, a.ID))
	case SortAge:
		return cmp.Or(cmp.Compare(a.SortTime().UnixNano(), b.SortTime().UnixNano()), strings.Compare(a.ID, b.ID))
	case SortAgeDesc:
		return cmp.Or(cmp.Compare(b.SortTime().UnixNano(), a.SortTime().UnixNano()), strings.Compare(b.ID, a.ID))
	}
	return strings.Compare(a.ID, b.ID)
}

// Past reports whether view comes after the place p's page starts after:
// every view does on the first page.
func (p Parsed) Past(view events.View) bool {
	if p.After == "" {
		return true
	}
	at := events.View{ID: p.After, Name: p.AfterName, UpdatedAt: time.Unix(0, p.AfterTime)}
	return p.Compare(view, at) > 0
}

// Next is the Next of a page of p's sort whose last view is last.
func (p Parsed) Next(last events.View) string {
	switch p.Sort {
	case SortName, SortNameDesc:
		return encodeCursor(p.Sort, last.Name, last.ID)
	case SortAge, SortAgeDesc:
		return encodeCursor(p.Sort, strconv.FormatInt(last.SortTime().UnixNano(), 10), last.ID)
	}
	return Cursor(last.ID)
}

// Cursor is the Next of a page in creation order whose last view is of
// sandbox id: the id itself, as it has always been.
func Cursor(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// encodeCursor is the Next of a sorted page: the sort, the sort key and id
// of its last view, on lines of their own (no id, name or time has a line
// feed), which a cursor in creation order never has.
func encodeCursor(sort, key, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(sort + "\n" + key + "\n" + id))
}

// decodeCursor returns the place of the previous page's last view: its id
// and sort key; none for no cursor. A cursor of another sort than sort is
// INVALID_ARGUMENT: its place means nothing in this order.
func decodeCursor(c, sort string) (Parsed, error) {
	if c == "" {
		return Parsed{}, nil
	}
	bad := events.Errorf(events.CodeInvalidArgument, "cursor %q: not a cursor of this list", c)
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return Parsed{}, bad
	}
	parts := strings.Split(string(b), "\n")
	cursorSort := SortCreated
	if len(parts) == 3 {
		cursorSort = parts[0]
	}
	if cursorSort != sort && slices.Contains(Sorts, cursorSort) {
		return Parsed{}, events.Errorf(events.CodeInvalidArgument, "cursor %q: of a list sorted by %s, not %s", c, cursorSort, sort)
	}
	switch {
	case len(parts) == 1 && KeyName(parts[0]):
		return Parsed{After: parts[0]}, nil
	case len(parts) != 3 || !KeyName(parts[2]):
		return Parsed{}, bad
	}
	p := Parsed{After: parts[2], AfterName: parts[1]}
	if sort == SortAge || sort == SortAgeDesc {
		if p.AfterTime, err = strconv.ParseInt(parts[1], 10, 64); err != nil {
			return Parsed{}, bad
		}
		p.AfterName = ""
	}
	return p, nil
}

// parseLabel splits a "k=v" label filter; "" means none.
func parseLabel(s string) (k, v string, err error) {
	if s == "" {
		return "", "", nil
	}
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return "", "", events.Errorf(events.CodeInvalidArgument, "label %q: want key=value", s)
	}
	return k, v, nil
}

// KeyName reports whether s can be a NATS KV key without being a wildcard:
// the characters NATS allows in a key, no empty tokens. Every view's
// cursors follow it.
func KeyName(s string) bool {
	if s == "" || s[0] == '.' || s[len(s)-1] == '.' {
		return false
	}
	prev := byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '/' || c == '=' || c == '.'
		if !ok || c == '.' && prev == '.' {
			return false
		}
		prev = c
	}
	return true
}

// ViewID reports whether id can be a sandbox's view in every view: a KV
// key (KeyName) without dots. A sandbox id has none (events.CheckAppend
// refuses them); a key with dots is never a view.
func ViewID(id string) bool { return KeyName(id) && !strings.Contains(id, ".") }
