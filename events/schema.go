package events

import (
	"encoding/json"
	"fmt"
	"sync"
)

// Upcaster turns the data of an event of one type written under schema
// version from into its data under from+1. It must not change the meaning
// of the event: an upcaster adds a field's old default, renames a field,
// splits one into two. An event type whose data did not change between two
// versions needs none.
type Upcaster func(data json.RawMessage) (json.RawMessage, error)

// Schemas is how a build reads events written under older envelope
// schemas: their data goes through each version's upcaster, oldest first,
// up to the version the build writes, before it is decoded. The log is
// never rewritten: a replay reads old events as the current code knows
// them. The package's own (RegisterUpcaster, Envelope.Decode) is at
// SchemaVersion; NewSchemas makes another, for a test of what a later
// build reads.
type Schemas struct {
	current int

	mu sync.RWMutex
	up map[string]map[int]Upcaster // by type, by the version read from
}

// NewSchemas returns the schemas of a build that writes version current.
func NewSchemas(current int) *Schemas {
	return &Schemas{current: current, up: map[string]map[int]Upcaster{}}
}

// Current is the version s's build writes.
func (s *Schemas) Current() int { return s.current }

// Register adds the upcaster of typ's data from version from to from+1.
// It panics on a version outside 1 to Current()-1 or a second upcaster of
// the same step: both are mistakes of the build, not of the log.
func (s *Schemas) Register(typ string, from int, f Upcaster) {
	if from < 1 || from >= s.current {
		panic(fmt.Sprintf("events: upcaster of %s from schema %d: this build writes %d", typ, from, s.current))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.up[typ] == nil {
		s.up[typ] = map[int]Upcaster{}
	}
	if _, dup := s.up[typ][from]; dup {
		panic(fmt.Sprintf("events: upcaster of %s from schema %d registered twice", typ, from))
	}
	s.up[typ][from] = f
}

// Upcast returns env as the current schema has it: its data through the
// upcasters of its type from env.Schema up, and Schema set to Current().
// An env of the current schema is returned as it is; one of a newer
// schema than this build reads, or of none, is an error wrapping
// ErrForeign.
func (s *Schemas) Upcast(env Envelope) (Envelope, error) {
	switch {
	case env.Schema == s.current:
		return env, nil
	case env.Schema < 1 || env.Schema > s.current:
		return env, fmt.Errorf("%w: schema %d, this build reads 1 to %d", ErrForeign, env.Schema, s.current)
	}
	s.mu.RLock()
	steps := s.up[env.Type]
	s.mu.RUnlock()
	data := env.Data
	for v := env.Schema; v < s.current; v++ {
		f := steps[v]
		if f == nil {
			continue // the type's data did not change from v to v+1
		}
		out, err := f(data)
		if err != nil {
			return env, fmt.Errorf("upcast %s (event %s) from schema %d: %w", env.Type, env.ID, v, err)
		}
		data = out
	}
	env.Data, env.Schema, env.event = data, s.current, nil
	return env, nil
}

// schemas is this build's: it writes SchemaVersion.
var schemas = NewSchemas(SchemaVersion)

// RegisterUpcaster adds to this build the upcaster of typ's data from
// schema version from to from+1 (see Schemas.Register); call it from init
// when SchemaVersion moves on.
func RegisterUpcaster(typ string, from int, f Upcaster) { schemas.Register(typ, from, f) }
