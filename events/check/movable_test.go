package check_test

import (
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
)

// TestExportedOnlyWhileHeld: an export ahead (issue 29) is a fact of
// suspended on the state it names, held. A clean log with one has no
// violation; one of a state not held (forged, or a note a resume or a new
// suspension overtook) is passed over by the check as by the views,
// counted, and no violation; one outside suspended too.
func TestExportedOnlyWhileHeld(t *testing.T) {
	exported := func(ref string) step {
		return step{&events.RetainedStateExported{RestoreRef: ref, Via: "obj:" + ref, Bytes: 7}, "suspended", ""}
	}
	failed := step{&events.ResumeFailed{Generation: 2}, "suspended", "c3"}
	suspend2 := step{&events.SuspendRequested{Generation: 2}, "suspending", "c4"}
	suspended2 := step{&events.Suspended{Generation: 2, RestoreRef: "r2"}, "suspended", "c4"}
	cases := []struct {
		name    string
		steps   []step
		refused int
	}{
		{"held", []step{created, attached1, suspend1, suspended, exported("r1"), resume2, consumed2, resumed2, attached2}, 0},
		{"held after a failed resume", []step{created, attached1, suspend1, suspended, resume2, failed, exported("r1")}, 0},
		{"another reference", []step{created, attached1, suspend1, suspended, exported("r0")}, 1},
		{"no reference", []step{created, attached1, suspend1, suspended, exported("")}, 1},
		{"before the suspension", []step{created, attached1, suspend1, exported("r1")}, 1},
		{"after the consumption", []step{created, attached1, suspend1, suspended, resume2, consumed2, exported("r1")}, 1},
		{"of the state before a new suspension", []step{created, attached1, suspend1, suspended, resume2, consumed2, resumed2, attached2,
			suspend2, suspended2, exported("r1"), exported("r2")}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var refused []string
			o := check.Options{Refused: func(env events.Envelope, err error) { refused = append(refused, env.Type) }}
			if vs := check.Log(build(t, c.steps...), o); len(vs) != 0 {
				t.Errorf("violations %v; want none", vs)
			}
			if len(refused) != c.refused {
				t.Errorf("refused %v; want %d", refused, c.refused)
			}
		})
	}
}
