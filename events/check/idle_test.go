package check_test

import (
	"strings"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
)

// Issue 27: an idle timeout is a fact of ready, followed in the same append
// by the start of its action.
var (
	idlePolicy  = events.IdlePolicy{After: "1m0s", Action: events.IdleSuspend, Fallback: events.IdleFallbackStop}
	idleSuspend = step{&events.IdleTimeout{Policy: idlePolicy, LastActiveAt: t0, Action: events.IdleSuspend}, "ready", "c1"}
	idleStop    = step{&events.IdleTimeout{Policy: idlePolicy, LastActiveAt: t0, Action: events.IdleStop}, "ready", "c1"}
)

// TestIdleTimeoutIsClean: an idle suspension, a rejected one and an idle
// stop have no violation.
func TestIdleTimeoutIsClean(t *testing.T) {
	logs := map[string][]step{
		"suspended": {created, attached1, idleSuspend, suspend1, suspended},
		"rejected": {created, attached1, idleSuspend, suspend1,
			step{&events.SuspendRejected{Generation: 1}, "ready", "c1"}},
		"stopped": {created, attached1, idleStop,
			step{&events.StopRequested{Generation: 1}, "stopping", "c1"},
			step{&events.Stopped{Generation: 1}, "stopped", "c1"}},
	}
	for name, steps := range logs {
		if vs := check.Log(build(t, steps...), check.Options{}); len(vs) != 0 {
			t.Errorf("%s: violations %v; want none", name, vs)
		}
	}
}

// TestIdleTimeoutOutOfPlace: an idle timeout not followed by the start of
// its action is against the contract (outside ready, the table refuses
// it too: every reader passes over it, TestContractAndTable).
func TestIdleTimeoutOutOfPlace(t *testing.T) {
	cases := map[string]struct {
		steps []step
		seq   uint64
		want  string
	}{
		"suspend followed by a stop": {[]step{created, attached1, idleSuspend,
			step{&events.StopRequested{Generation: 1}, "stopping", "c1"}}, 4, "followed by no suspend_requested"},
		"stop followed by nothing of it": {[]step{created, attached1, idleStop,
			step{&events.Active{Source: events.ActiveTouch, At: t0}, "ready", "c1"}}, 4, "followed by no stop_requested"},
	}
	for name, c := range cases {
		vs := check.Log(build(t, c.steps...), check.Options{})
		found := false
		for _, v := range vs {
			found = found || (v.Seq == c.seq && strings.Contains(v.Message, c.want))
		}
		if !found {
			t.Errorf("%s: violations %v; want one at seq %d saying %q", name, vs, c.seq, c.want)
		}
	}
}
