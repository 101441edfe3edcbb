package events

import (
	"encoding/json"
	"fmt"
	"sort"
)

// Event is one lifecycle fact. Type is its stable dotted name.
//
// The events that report on one supervisor generation (a driver's outcome,
// a supervisor's attach, detach or exit) also have SpeaksFor() int64, the
// generation they are about, so that their consumers can fence reports of
// other generations without knowing every type.
type Event interface {
	Type() string
}

var registry = map[string]func() Event{}

// register adds the constructor of an event type; called from init in each
// family file.
func register(fs ...func() Event) {
	for _, f := range fs {
		t := f().Type()
		if _, dup := registry[t]; dup {
			panic("events: type registered twice: " + t)
		}
		registry[t] = f
	}
}

// Decode turns a type name and its JSON data into the typed event.
func Decode(typ string, data []byte) (Event, error) {
	f, ok := registry[typ]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	e := f()
	if len(data) > 0 && string(data) != "null" {
		if err := json.Unmarshal(data, e); err != nil {
			return nil, fmt.Errorf("decode %s: %w", typ, err)
		}
	}
	return e, nil
}

// Known reports whether typ is a registered event type.
func Known(typ string) bool { _, ok := registry[typ]; return ok }

// Intent reports whether typ is an intent: one of the types that ask a
// driver for a step.
func Intent(typ string) bool {
	switch typ {
	case TypeCreated, TypeStartRequested, TypeStopRequested,
		TypeSuspendRequested, TypeResumeRequested, TypeDeleteRequested:
		return true
	}
	return false
}

// Types lists every registered event type, sorted.
func Types() []string {
	ts := make([]string, 0, len(registry))
	for t := range registry {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	return ts
}

// New returns a zero event of type typ, for tests and golden files.
func New(typ string) (Event, bool) {
	f, ok := registry[typ]
	if !ok {
		return nil, false
	}
	return f(), true
}
