package events

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"
)

// TestAppendJSONIsMarshal: AppendJSON writes json.Marshal's bytes, on its
// fast path and off it.
func TestAppendJSONIsMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", "-", ".", ":", " ", "é", "<", ">", "&", `"`, `\`, "\n", "\x00", "\u2028", "\xff", "日"}
	str := func(plain bool) string {
		n := r.IntN(12)
		s := ""
		for range n {
			if plain {
				s += alphabet[r.IntN(7)]
			} else {
				s += alphabet[r.IntN(len(alphabet))]
			}
		}
		return s
	}
	events := []func(plain bool) Event{
		func(p bool) Event {
			return &Created{Name: str(p), Labels: map[string]string{str(p): str(p)}, Generation: r.Int64N(9)}
		},
		func(bool) Event { return &SuspendRequested{Generation: r.Int64N(9)} },
		func(p bool) Event { return &Suspended{Generation: 1, RestoreRef: str(p)} },
		func(p bool) Event { return &ResourceLost{Generation: 2, Message: str(p)} },
	}
	fast := 0
	for i := range 5000 {
		plain := i%2 == 0
		zone := time.UTC
		if r.IntN(10) == 0 {
			zone = time.FixedZone("x", 3600)
		}
		now := time.Unix(r.Int64N(1<<34), r.Int64N(1e9)).In(zone)
		if r.IntN(20) == 0 {
			now = now.Truncate(time.Second)
		}
		env, err := NewEnvelope(str(plain), events[r.IntN(len(events))](plain), Meta{Actor: str(plain), CommandID: str(plain), CorrelationID: str(plain), CausationID: str(plain)}, now)
		if err != nil {
			t.Fatal(err)
		}
		env.ID = str(plain)
		if r.IntN(3) == 0 {
			env.Phase = Phase(str(plain))
		}
		if r.IntN(10) == 0 {
			env.Time = now // not UTC: NewEnvelope set UTC
		}
		if r.IntN(10) == 0 { // as decoded from the log: data not encoded here
			env = Envelope{ID: env.ID, SandboxID: env.SandboxID, Type: env.Type, Schema: env.Schema, Time: env.Time, Data: json.RawMessage(` { "a" : "<" } `)}
		}
		want, werr := json.Marshal(env)
		got, gerr := env.AppendJSON([]byte("prefix"))
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("errors differ: AppendJSON %v, json.Marshal %v", gerr, werr)
		}
		if werr != nil {
			continue
		}
		if string(got) != "prefix"+string(want) {
			t.Fatalf("AppendJSON:\n got %s\nwant prefix%s", got, want)
		}
		if env.plain() {
			fast++
		}
	}
	if fast < 1000 {
		t.Errorf("only %d of 5000 envelopes took the fast path", fast)
	}
}

func BenchmarkEncodeEnvelope(b *testing.B) {
	env, _ := NewEnvelope("0190f6b4-7f8e-7c2a-9c1e-3d2b1a0f9e8d", &Started{Generation: 3, CredentialHash: "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"},
		Meta{Actor: "sagas", CommandID: "c", CorrelationID: "0190f6b4-7f8e-7c2a-9c1e-3d2b1a0f9e8e", CausationID: "0190f6b4-7f8e-7c2a-9c1e-3d2b1a0f9e8f"}, time.Now())
	env.Phase = PhaseReady
	b.Run("AppendJSON", func(b *testing.B) {
		var buf []byte
		for range b.N {
			buf, _ = env.AppendJSON(buf[:0])
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		for range b.N {
			_, _ = json.Marshal(env)
		}
	})
}
