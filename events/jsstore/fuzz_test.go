package jsstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/torpor/torpor/events"
)

// FuzzEnvelope: a message on a sandbox's subject, with any type header and
// any body, is read (vet, then the event decoded through the upcasters) as
// a torpor event of a registered type, of the subject's sandbox, or is
// foreign (an error wrapping events.ErrForeign), never a panic. The fast
// decoder agrees with json.Unmarshal on every body, and an envelope read
// and written again reads back the same. Go test -fuzz (.ci/run runs it
// for a few seconds).
func FuzzEnvelope(f *testing.F) {
	golden, err := filepath.Glob("../testdata/*.json")
	if err != nil || len(golden) == 0 {
		f.Fatalf("no golden events in ../testdata: %v", err)
	}
	const id = "0193b0a4-0000-7000-8000-000000000001"
	for _, path := range golden {
		body, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		var env events.Envelope
		if err := json.Unmarshal(body, &env); err != nil {
			f.Fatal(err)
		}
		f.Add(id, env.Type, body)
		compact, _ := env.AppendJSON(nil)
		f.Add(id, env.Type, compact) // as the store writes it: the fast path
	}
	for _, s := range []struct{ id, typ, body string }{
		{id, "sandbox.created", `{"id":"e1","sandbox_id":"` + id + `","type":"sandbox.created","schema":1,"time":"2026-11-30T10:02:00+01:00","data":{"name":"a","driver":"sim","node":"n","generation":1}}`},
		{id, "sandbox.created", `{"id":"e1","sandbox_id":"` + id + `","type":"sandbox.created","schema":2,"time":"2026-11-30T10:02:00Z","data":{}}`},
		{id, "sandbox.created", `{"id":"e1","sandbox_id":"` + id + `","type":"sandbox.created","schema":0,"time":"2026-11-30T10:02:00Z","data":{}}`},
		{id, "sandbox.stopped", `{"id":"e1","sandbox_id":"` + id + `","type":"sandbox.stopped","schema":1,"time":"2026-11-30T10:02:00Z","data":"not an object"}`},
		{id, "sandbox.suspended", `{"id":"e1","sandbox_id":"` + id + `","type":"sandbox.suspended","schema":1,"time":"2026-11-30T10:02:00Z","phase":"bogus","data":null}`},
		{"0193b0a4-0000-7000-8000-000000000002", "sandbox.created", `{"id":"e1","sandbox_id":"` + id + `","type":"sandbox.created","schema":1,"time":"2026-11-30T10:02:00Z","data":{}}`},
		{"ZZ", "sandbox.created", `{"id":"e1","sandbox_id":"ZZ","type":"sandbox.created","schema":1,"time":"2026-11-30T10:02:00Z","data":{}}`},
		{id, "sandbox.created", `{"ID":"e1","Sandbox_ID":"` + id + `","TYPE":"sandbox.created","schema":1,"time":"2026-11-30T10:02:00Z","data":{}}`},
		{id, "sandbox.created", `{"id":"e\u00e9","sandbox_id":"` + id + `","type":"sandbox.created","schema":1,"time":"2026-11-30T10:02:00Z","data":[1]}`},
		{id, "nope", `{"id":"e1","sandbox_id":"` + id + `","type":"nope","schema":1,"time":"2026-11-30T10:02:00Z","data":{}}`},
		{id, "", `{"id":"e1"}`},
		{id, "sandbox.created", `{"schema":01}`},
		{id, "sandbox.created", `{"schema":-0}`},
		{id, "sandbox.created", `{"data":{"a":"}"}}`},
		{id, "sandbox.created", `{} {}`},
		{id, "sandbox.created", `not json`},
		{id, "sandbox.created", ``},
	} {
		f.Add(s.id, s.typ, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, id, typ string, body []byte) {
		var want events.Envelope
		werr := json.Unmarshal(body, &want)
		got, gerr := events.DecodeEnvelope(body)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%q: DecodeEnvelope says %v, json.Unmarshal %v", body, gerr, werr)
		}
		if werr == nil {
			if diff := differ(got, want, false); diff != "" {
				t.Fatalf("%q: DecodeEnvelope and json.Unmarshal differ in %s:\n%+v\n%+v", body, diff, got, want)
			}
		}

		env, err := vet(body, SubjectPrefix+id, typ)
		if err != nil {
			if !errors.Is(err, events.ErrForeign) {
				t.Fatalf("%q on %q (type %q): %v, not foreign", body, id, typ, err)
			}
			return
		}
		switch {
		case !events.Known(env.Type) || env.Type != typ:
			t.Fatalf("%q (type header %q) read as type %q", body, typ, env.Type)
		case env.SandboxID != id:
			t.Fatalf("%q on the subject of %q read as of sandbox %q", body, id, env.SandboxID)
		case env.ID == "" || env.Schema < 1 || env.Schema > events.SchemaVersion:
			t.Fatalf("%q read with id %q, schema %d", body, env.ID, env.Schema)
		}
		if e, err := env.Decode(); err == nil && e.Type() != env.Type {
			t.Fatalf("%q decoded as a %s", body, e.Type())
		}

		// Written again (as a store writes), it reads back the same; and
		// once written, writing is a fixed point.
		again, err := env.AppendJSON(nil)
		if err != nil {
			t.Fatalf("%+v read, then not written: %v", env, err)
		}
		back, err := vet(again, SubjectPrefix+id, typ)
		if err != nil {
			t.Fatalf("%q read, written as %q, then not read: %v", body, again, err)
		}
		if diff := differ(back, env, true); diff != "" {
			t.Fatalf("%q read, written as %q, read back with another %s", body, again, diff)
		}
		twice, err := back.AppendJSON(nil)
		if err != nil || !bytes.Equal(twice, again) {
			t.Fatalf("written once %q, twice %q (%v)", again, twice, err)
		}
	})
}

// differ names the first field in which a and b differ ("" for none): the
// same instant (and zone offset) for the time, the same data (with
// compact, as json.Marshal writes it, and none the same as null).
func differ(a, b events.Envelope, compact bool) string {
	switch {
	case !a.Time.Equal(b.Time):
		return "time"
	case a.Time.Location().String() != b.Time.Location().String() && !compact:
		return "time zone"
	}
	_, ao := a.Time.Zone()
	_, bo := b.Time.Zone()
	if ao != bo {
		return "time offset"
	}
	ad, bd := []byte(a.Data), []byte(b.Data)
	if compact {
		// No data at all is written as null.
		if ad == nil {
			ad = []byte("null")
		}
		if bd == nil {
			bd = []byte("null")
		}
		ad, bd = written(ad), written(bd)
	}
	if !bytes.Equal(ad, bd) {
		return "data"
	}
	a.Time, a.Data, b.Data = b.Time, nil, nil
	a.Seq, a.MsgID = b.Seq, b.MsgID
	if !reflect.DeepEqual(a, b) {
		return "envelope fields"
	}
	return ""
}

// written is data as json.Marshal writes a json.RawMessage: compacted, with
// <, > and & (and U+2028, U+2029) escaped.
func written(data []byte) []byte {
	var c, e bytes.Buffer
	if json.Compact(&c, data) != nil {
		return data
	}
	json.HTMLEscape(&e, c.Bytes())
	return e.Bytes()
}
