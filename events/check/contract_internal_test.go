package check

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/torpor/torpor/events"
)

// variants are the events of type typ the contract's rows tell apart.
func variants(typ string, p events.Phase) []events.Event {
	e, _ := events.New(typ)
	switch e := e.(type) {
	case *events.Stopped:
		return []events.Event{e, &events.Stopped{Reason: events.ReasonRetainedStateLost}}
	case *events.StartRequested:
		return []events.Event{e, &events.StartRequested{Fallback: true}}
	case *events.RetainedStateInvalidated:
		return []events.Event{e, &events.RetainedStateInvalidated{Reason: events.ReasonExpired}}
	case *events.Expired:
		return []events.Event{&events.Expired{Policy: events.ExpiryTTL}, &events.Expired{Policy: events.ExpiryRetention}}
	case *events.IdleTimeout:
		return []events.Event{&events.IdleTimeout{Action: events.IdleSuspend}, &events.IdleTimeout{Action: events.IdleStop}}
	case *events.DeadlinePassed:
		var out []events.Event
		for _, q := range events.Phases {
			out = append(out, &events.DeadlinePassed{Phase: q})
		}
		return out
	}
	return []events.Event{e}
}

// lives are every state of CONTRACT §1's rows in phase p.
func lives(p events.Phase) []life {
	var out []life
	for _, b := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31} {
		for _, settled := range []events.Phase{"", stopping, suspending, starting} {
			out = append(out, life{phase: p, resume: b&1 != 0, consumed: b&2 != 0, fallback: b&4 != 0, discard: b&8 != 0, attached: b&16 != 0, settled: settled})
		}
	}
	return out
}

// TestContractAndTable compares contract.go, row by row, with the
// lifecycle table the gateway decides with and the views fold with
// (events.Table): a pair (phase, event type) one takes in some state of
// the contract's rows and the other refuses, or where they lead to
// different phases. Today they agree pair by pair; the contract's rows
// are narrower within a pair (which starting, before or after the
// consumption, right after a compensation), and the check reports a log
// that goes through a pair the table takes in a state the contract does
// not (TestViolations).
func TestContractAndTable(t *testing.T) {
	var diffs []string
	for _, p := range append([]events.Phase{none}, events.Phases...) {
		for _, typ := range events.Types() {
			var tos []string
			for _, l := range lives(p) {
				for _, e := range variants(typ, p) {
					l := l
					if to, _ := l.next(e); to != "" && !slices.Contains(tos, string(to)) {
						tos = append(tos, string(to))
					}
				}
			}
			slices.Sort(tos)
			table, err := events.Next(p, typ)
			switch {
			case err != nil && len(tos) > 0:
				diffs = append(diffs, fmt.Sprintf("%s %s: contract %s, table refuses", phaseName(p), typ, strings.Join(tos, "|")))
			case err == nil && len(tos) == 0:
				diffs = append(diffs, fmt.Sprintf("%s %s: contract refuses, table %s", phaseName(p), typ, table))
			case err == nil && !slices.Contains(tos, string(table)):
				diffs = append(diffs, fmt.Sprintf("%s %s: contract %s, table %s", phaseName(p), typ, strings.Join(tos, "|"), table))
			}
		}
	}
	if len(diffs) > 0 {
		t.Errorf("CONTRACT §1 (contract.go) and events.Table differ:\n%s", strings.Join(diffs, "\n"))
	}
}
