package events

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// sameDecode fails t unless DecodeEnvelope(b) is json.Unmarshal's answer.
func sameDecode(t *testing.T, b []byte) {
	t.Helper()
	var want Envelope
	wantErr := json.Unmarshal(b, &want)
	got, err := DecodeEnvelope(b)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("DecodeEnvelope(%s): error %v, json.Unmarshal error %v", b, err, wantErr)
	}
	if err != nil {
		return
	}
	if !reflect.DeepEqual(got, want) || !got.Time.Equal(want.Time) || got.Time.Location().String() != want.Time.Location().String() {
		t.Fatalf("DecodeEnvelope(%s):\n got %#v\nwant %#v", b, got, want)
	}
}

func TestDecodeEnvelopeIsUnmarshal(t *testing.T) {
	env, err := NewEnvelope("sbx-1", &Created{Name: "n", Labels: map[string]string{"a": "b"}, Generation: 1},
		Meta{Actor: "cli", CommandID: "c", CorrelationID: "r", CausationID: "s"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	env.Phase = PhaseProvisioning
	written, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := decodeFast(written); !ok {
		t.Errorf("an envelope as Append writes it takes the slow path: %s", written)
	}
	cases := []string{
		string(written),
		`{}`, ` { } `, `{"id":"a"}`, `[]`, `null`, ``, `{`, `{"id":"a",}`, `{"id":"a"} x`,
		`{"id":"a\"b","type":"t"}`, `{"id":"é"}`, `{"id":"a\u0041"}`, `{"ID":"upper"}`, `{"Sandbox_Id":"x"}`,
		`{"id":null}`, `{"data":null}`, `{"data":"str"}`, `{"data":12}`, `{"data":{"a":"}"}}`, `{"data":{"a":[1,{"b":"\"}"}]}}`,
		`{"data":{"a":}}`, `{"data":{"a":1}`, `{"data":[1,2]}`, `{"data":{}, "data":{"x":1}}`,
		`{"schema":1}`, `{"schema":-3}`, `{"schema":01}`, `{"schema":-0}`, `{"schema":1.5}`, `{"schema":1e2}`,
		`{"schema":99999999999999999999}`, `{"schema":"1"}`, `{"time":"2025-03-01T12:00:00Z"}`,
		`{"time":"2025-03-01T12:00:00.123456789+02:00"}`, `{"time":"yesterday"}`, `{"time":null}`, `{"time":1}`,
		`{"phase":"ready","unknown":1}`, "{\"id\":\"a\tb\"}", "{\n\t\"id\" : \"a\" ,\r\n\"type\":\"t\"\n}",
		`{"id":"a","id":"b"}`, `{"seq":5}`, `{"Seq":5}`, `{"msg_id":"x"}`,
	}
	files, _ := filepath.Glob("testdata/*.json")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, string(b))
	}
	for _, c := range cases {
		sameDecode(t, []byte(c))
	}
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte(`{"id":"a","sandbox_id":"s","type":"sandbox.created","schema":1,"time":"2025-03-01T12:00:00Z","phase":"ready","data":{"name":"x"}}`))
	f.Add([]byte(`{"data":{"a":"}\""}}`))
	f.Fuzz(func(t *testing.T, b []byte) { sameDecode(t, b) })
}

func BenchmarkDecodeEnvelope(b *testing.B) {
	env, _ := NewEnvelope("0190f6b4-7f8e-7c2a-9c1e-3d2b1a0f9e8d", &Started{Generation: 3, CredentialHash: "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"},
		Meta{Actor: "sagas", CommandID: "c", CorrelationID: "0190f6b4-7f8e-7c2a-9c1e-3d2b1a0f9e8e", CausationID: "0190f6b4-7f8e-7c2a-9c1e-3d2b1a0f9e8f"}, time.Now())
	env.Phase = PhaseReady
	body, _ := json.Marshal(env)
	b.Run("DecodeEnvelope", func(b *testing.B) {
		for range b.N {
			if _, err := DecodeEnvelope(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		for range b.N {
			var e Envelope
			if err := json.Unmarshal(body, &e); err != nil {
				b.Fatal(err)
			}
		}
	})
}
