package storetest

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
)

// Forged is what a bus client that is not torpor appends on the subject of
// sandbox id, a stopped sandbox of generation gen: well-formed events, each
// stamped with the phase a reader that trusted the stamp would show, each
// one the lifecycle table refuses in stopped (or whose data does not fit
// its type). The aggregate passes over every one of them; so must every
// view, the deadlines and the checker (issue 23, attack 5).
func Forged(id string, gen int64, now time.Time) []events.Envelope {
	raw := func(typ string, phase events.Phase, data string) events.Envelope {
		return events.Envelope{
			ID: uuid.Must(uuid.NewV7()).String(), SandboxID: id, Type: typ, Schema: events.SchemaVersion,
			Time: now.UTC(), Actor: "forger", Phase: phase, Data: json.RawMessage(data),
		}
	}
	g := json.RawMessage(`{"generation":` + itoa(gen) + `}`)
	return []events.Envelope{
		raw(events.TypeSuspended, events.PhaseSuspended, `{"generation":`+itoa(gen)+`,"restore_ref":"forged"}`),
		raw(events.TypeDeleted, events.PhaseDeleted, `{}`),
		raw(events.TypeExited, events.PhaseError, `{"generation":`+itoa(gen)+`,"code":66}`),
		raw(events.TypeStopped, "bogus", string(g)),
		raw(events.TypeStartRequested, events.PhaseStarting, `"not an object"`),
	}
}

// ForgedStopping is Forged for a sandbox whose stop hangs (stopping): the
// same kinds, each refused there, but for the exit, which the table takes
// in stopping as a fact that keeps the phase.
func ForgedStopping(id string, gen int64, now time.Time) []events.Envelope {
	out := Forged(id, gen, now)
	out[3].Type = events.TypeStarted // stopped is taken in stopping; started is not
	return out
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
