package sagas

import (
	"testing"

	"github.com/torpor/torpor/events"
)

// TestSettled: which later events settle an intent, so that a saga reading
// the log again (after a restart) does not call the driver for it.
func TestSettled(t *testing.T) {
	env := func(id, typ, cause string) events.Envelope {
		return events.Envelope{ID: id, Type: typ, CausationID: cause}
	}
	resume := env("r", events.TypeResumeRequested, "")
	suspend := env("s", events.TypeSuspendRequested, "")
	for _, tc := range []struct {
		name    string
		intent  events.Envelope
		later   []events.Envelope
		settled bool
	}{
		{"nothing after it", resume, nil, false},
		{"only its consumption (progress)", resume, []events.Envelope{env("c", events.TypeRetainedStateConsumed, "r")}, false},
		{"its outcome", resume, []events.Envelope{env("c", events.TypeRetainedStateConsumed, "r"), env("o", events.TypeResumed, "r")}, true},
		{"the restore recorded by the attach", resume, []events.Envelope{
			env("c", events.TypeRetainedStateConsumed, "r"), env("o", events.TypeResumed, "r"), env("a", events.TypeSupervisorAttached, "")}, true},
		{"an attach alone", resume, []events.Envelope{env("a", events.TypeSupervisorAttached, "")}, false},
		{"a later intent", resume, []events.Envelope{env("x", events.TypeStopRequested, "")}, true},
		{"a suspension and a restore not its own", suspend, []events.Envelope{env("o", events.TypeResumed, "")}, false},
	} {
		if got := settled(tc.intent, tc.later) != ""; got != tc.settled {
			t.Errorf("%s: settled %v, want %v", tc.name, got, tc.settled)
		}
	}
}
