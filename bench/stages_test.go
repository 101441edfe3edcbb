package bench

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// entry is a history entry of type typ at t with data e.
func entry(t *testing.T, at time.Time, e events.Event) events.HistoryEntry {
	t.Helper()
	data, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return events.HistoryEntry{Type: e.Type(), Time: at, Data: data}
}

// TestResumeStagesRows: the stages of the newest resume of a history are
// read from the command accepted (its sandbox.resume_requested's time) to
// the times sandbox.resumed carries and the resumed generation's attach;
// an earlier resume and an older generation's attach are not taken; the
// rows give each stage's percentiles in order, and "not lazy here" for
// loaded when no resume said it.
func TestResumeStagesRows(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 15, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	history := func(base int) []events.HistoryEntry {
		return []events.HistoryEntry{
			entry(t, ms(0), &events.ResumeRequested{Generation: 2}), // an earlier resume
			entry(t, ms(1), &events.Resumed{Generation: 2, Outcome: events.OutcomeRestored, RestoreStartedAt: ms(2), RunningAt: ms(3)}),
			entry(t, ms(4), &events.SupervisorAttached{Generation: 2}),
			entry(t, ms(base), &events.ResumeRequested{Generation: 3}),
			entry(t, ms(base+1), &events.SupervisorAttached{Generation: 2}), // not the resumed generation
			entry(t, ms(base+5), &events.RetainedStateConsumed{Generation: 3}),
			entry(t, ms(base+40), &events.Resumed{Generation: 3, Outcome: events.OutcomeRestored, RestoreStartedAt: ms(base + 10), RunningAt: ms(base + 30)}),
			entry(t, ms(base+70), &events.SupervisorAttached{Generation: 3}),
		}
	}
	got, err := resumeStages(history(100))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{"restore_started": 10 * time.Millisecond, "running": 30 * time.Millisecond, "ready": 70 * time.Millisecond}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("resumeStages = %v, want %v", got, want)
	}
	if _, err := resumeStages(history(100)[1:3]); err == nil {
		t.Error("a history without a resume: no error")
	}

	s := stageSamples{}
	for _, st := range []map[string]time.Duration{got, {"restore_started": 20 * time.Millisecond, "running": 50 * time.Millisecond, "ready": 90 * time.Millisecond}} {
		for k, d := range st {
			s[k] = append(s[k], d)
		}
	}
	rows := s.rows()
	var names []string
	for _, r := range rows {
		names = append(names, r.Stage)
	}
	if want := []string{"restore_started", "running", "ready", "loaded"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("rows' stages = %v, want %v", names, want)
	}
	for i, w := range []struct {
		max     float64
		missing string
	}{{20, ""}, {50, ""}, {90, ""}, {0, "not lazy here"}} {
		if rows[i].Latency.Max != w.max || rows[i].Missing != w.missing || (w.missing == "" && rows[i].Latency.Samples != 2) {
			t.Errorf("row %s = %+v, want max %g ms over 2, missing %q", rows[i].Stage, rows[i], w.max, w.missing)
		}
	}
	line := stageLine("vm resume latency, same node (tcg)", rows)
	for _, part := range []string{"(tcg)", "→ready p50", "max 90.00 ms", "→loaded: not lazy here"} {
		if !strings.Contains(line, part) {
			t.Errorf("the report's line %q lacks %q", line, part)
		}
	}
}
