package events_test

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/torpor/torpor/events"
)

// createdV2 is sandbox.created as a later build (schema 2) might write it:
// driver_options renamed options, and a restart policy that schema 1 did
// not have (its meaning then: never).
type createdV2 struct {
	Name          string            `json:"name"`
	Driver        string            `json:"driver"`
	Options       map[string]string `json:"options"`
	RestartPolicy string            `json:"restart_policy"`
	Generation    int64             `json:"generation"`
}

// createdToV2 is that build's upcaster of sandbox.created from schema 1.
func createdToV2(data json.RawMessage) (json.RawMessage, error) {
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	if opts, ok := m["driver_options"]; ok {
		m["options"] = opts
		delete(m, "driver_options")
	}
	if _, ok := m["restart_policy"]; !ok {
		m["restart_policy"] = "never"
	}
	return json.Marshal(m)
}

func golden(t *testing.T, typ string) events.Envelope {
	t.Helper()
	b, err := os.ReadFile("testdata/" + typ + ".json")
	if err != nil {
		t.Fatal(err)
	}
	env, err := events.DecodeEnvelope(b)
	if err != nil {
		t.Fatal(err)
	}
	if env.Schema != 1 {
		t.Fatalf("the golden %s is of schema %d, want 1", typ, env.Schema)
	}
	return env
}

// TestUpcastV1GoldenWithV2Code: the schema 1 golden sandbox.created, read
// by a build that writes schema 2, comes out as schema 2 says, its values
// kept; a type whose data did not change passes as it is; a newer schema
// than the build's is foreign.
func TestUpcastV1GoldenWithV2Code(t *testing.T) {
	v2 := events.NewSchemas(2)
	v2.Register(events.TypeCreated, 1, createdToV2)

	up, err := v2.Upcast(golden(t, events.TypeCreated))
	if err != nil {
		t.Fatal(err)
	}
	var c createdV2
	if err := json.Unmarshal(up.Data, &c); err != nil {
		t.Fatal(err)
	}
	if up.Schema != 2 || c.Name != "web" || c.Driver != "sim" || c.Options["latency"] != "5ms" || c.RestartPolicy != "never" || c.Generation != 1 {
		t.Fatalf("upcast: schema %d, %+v from %s", up.Schema, c, up.Data)
	}

	started := golden(t, events.TypeStarted)
	up, err = v2.Upcast(started)
	if err != nil || up.Schema != 2 || string(up.Data) != string(started.Data) {
		t.Fatalf("a type with no upcaster: schema %d, data %s, %v; want its data as it was", up.Schema, up.Data, err)
	}
	e, err := events.Decode(up.Type, up.Data)
	if err != nil || e.(*events.Started).Generation != 2 {
		t.Fatalf("decoded %+v, %v", e, err)
	}

	newer := golden(t, events.TypeStarted)
	newer.Schema = 3
	if _, err := v2.Upcast(newer); !errors.Is(err, events.ErrForeign) {
		t.Fatalf("schema 3 read by a build of 2: %v, want ErrForeign", err)
	}
}

// TestUpcasterErrorsAndMistakes: an upcaster that fails says which event
// and from which schema; registering outside the build's versions, or
// twice, panics.
func TestUpcasterErrorsAndMistakes(t *testing.T) {
	v2 := events.NewSchemas(2)
	v2.Register(events.TypeCreated, 1, func(json.RawMessage) (json.RawMessage, error) { return nil, errors.New("no") })
	env := golden(t, events.TypeCreated)
	if _, err := v2.Upcast(env); err == nil || !strings.Contains(err.Error(), env.ID) || !strings.Contains(err.Error(), "schema 1") {
		t.Fatalf("a failing upcaster: %v", err)
	}
	for name, f := range map[string]func(){
		"from the current schema": func() { v2.Register(events.TypeStarted, 2, createdToV2) },
		"from schema 0":           func() { v2.Register(events.TypeStarted, 0, createdToV2) },
		"twice":                   func() { v2.Register(events.TypeCreated, 1, createdToV2) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("register %s: no panic", name)
				}
			}()
			f()
		}()
	}
}
