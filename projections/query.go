package projections

import (
	"encoding/base64"
	"strings"

	"github.com/torpor/torpor/events"
)

// Page sizes of a view's List.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Query selects the views a view's List returns. The zero value lists
// everything, deleted sandboxes included, DefaultLimit at a time.
type Query struct {
	// Phase keeps views in that phase; empty keeps all.
	Phase events.Phase
	// Label keeps views carrying label "k=v"; empty keeps all.
	Label string
	// Limit is the page size: 0 means DefaultLimit, above MaxLimit means MaxLimit.
	Limit int
	// Cursor is the Next of the previous page; empty starts at the oldest.
	Cursor string
}

// Parsed is a Query checked: the id its page starts after, its label
// filter split, its page size resolved.
type Parsed struct {
	After                string
	LabelKey, LabelValue string
	Phase                events.Phase
	Limit                int
}

// Parse checks q as every view's List does: a malformed cursor, label,
// phase or a negative limit is an INVALID_ARGUMENT error.
func (q Query) Parse() (Parsed, error) {
	after, err := decodeCursor(q.Cursor)
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
	return Parsed{After: after, LabelKey: lk, LabelValue: lv, Phase: q.Phase, Limit: limit}, nil
}

// Keeps reports whether view passes p's phase and label filters.
func (p Parsed) Keeps(view events.View) bool {
	if p.Phase != events.PhaseNone && view.Phase != p.Phase {
		return false
	}
	if p.LabelKey != "" {
		if got, ok := view.Labels[p.LabelKey]; !ok || got != p.LabelValue {
			return false
		}
	}
	return true
}

// Cursor is the Next of a page whose last view is of sandbox id.
func Cursor(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// decodeCursor returns the last id of the previous page; "" for no cursor.
func decodeCursor(c string) (string, error) {
	if c == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || !KeyName(string(b)) {
		return "", events.Errorf(events.CodeInvalidArgument, "cursor %q: not a cursor of this list", c)
	}
	return string(b), nil
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
