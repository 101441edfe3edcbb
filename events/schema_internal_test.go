package events

import (
	"encoding/json"
	"os"
	"testing"
)

// TestDecodeUpcasts: Envelope.Decode reads an event of an older schema
// through this build's upcasters (here a build made to write schema 2 whose
// upcaster of sandbox.created from 1 fills in a label).
func TestDecodeUpcasts(t *testing.T) {
	old := schemas
	t.Cleanup(func() { schemas = old })
	schemas = NewSchemas(2)
	schemas.Register(TypeCreated, 1, func(data json.RawMessage) (json.RawMessage, error) {
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, err
		}
		m["labels"] = map[string]string{"from": "schema 1"}
		return json.Marshal(m)
	})
	b, err := os.ReadFile("testdata/sandbox.created.json")
	if err != nil {
		t.Fatal(err)
	}
	env, err := DecodeEnvelope(b)
	if err != nil {
		t.Fatal(err)
	}
	e, err := env.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if c := e.(*Created); c.Labels["from"] != "schema 1" || c.Name != "web" {
		t.Fatalf("decoded %+v, want it upcast", c)
	}
}
