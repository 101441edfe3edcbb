package gateway

import (
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// TestReportedExported: a note that the retained state was exported ahead
// (issue 29) is appended only while the sandbox is suspended on that
// state, held; judged at the head, a note a resume, a discard, a delete or
// a new suspension overtook is refused (FAILED_PRECONDITION), appending
// nothing.
func TestReportedExported(t *testing.T) {
	exported := func(ref string) *events.RetainedStateExported {
		return &events.RetainedStateExported{RestoreRef: ref, Via: "obj:" + ref, Bytes: 42}
	}
	failed := append(resuming[:6:6], &events.ResumeFailed{Generation: 2})
	again := append(resumed[:9:9], &events.SuspendRequested{Generation: 2}, &events.Suspended{Generation: 2, RestoreRef: "ref-2"})
	discarded := append(suspended[:5:5], &events.StartRequested{Generation: 2}, &events.RetainedStateDiscarded{RestoreRef: "ref-1"})
	deleting := append(suspended[:5:5], &events.DeleteRequested{})
	cases := []struct {
		name  string
		given []events.Event
		when  *events.RetainedStateExported
		code  events.Code
	}{
		{"suspended on it", suspended, exported("ref-1"), ""},
		{"suspended again after a failed resume", failed, exported("ref-1"), ""},
		{"another reference", suspended, exported("ref-0"), events.CodeFailedPrecondition},
		{"no reference", suspended, exported(""), events.CodeFailedPrecondition},
		{"a resume under way", resuming, exported("ref-1"), events.CodeFailedPrecondition},
		{"resumed", resumed, exported("ref-1"), events.CodeFailedPrecondition},
		{"suspended on another since", again, exported("ref-1"), events.CodeFailedPrecondition},
		{"discarded", discarded, exported("ref-1"), events.CodeFailedPrecondition},
		{"deleting", deleting, exported("ref-1"), events.CodeFailedPrecondition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var then []events.Event
			if c.code == "" {
				then = []events.Event{c.when}
			}
			reportedIs(t, given(t, c.given...), []events.Event{c.when}, time.Unix(100, 0), c.code, then)
		})
	}
}

// TestApplyPassesOverAStaleExported: folding the log, the aggregate
// refuses an exported note (forged, or a writer's bug) of a state it does
// not hold, as the views do, and its state and view stay as they were.
func TestApplyPassesOverAStaleExported(t *testing.T) {
	again := append(resumed[:9:9], &events.SuspendRequested{Generation: 2}, &events.Suspended{Generation: 2, RestoreRef: "ref-2"})
	for _, c := range []struct {
		name  string
		given []events.Event
		ref   string
		took  bool
	}{
		{"held", suspended, "ref-1", true},
		{"another reference", suspended, "ref-0", false},
		{"superseded", again, "ref-1", false},
		{"consumed", resumed, "ref-1", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			sb := given(t, c.given...)
			before := *sb
			env, err := events.NewEnvelope(sid, &events.RetainedStateExported{RestoreRef: c.ref, Bytes: 42}, events.Meta{}, time.Unix(50, 0))
			if err != nil {
				t.Fatal(err)
			}
			env.Seq = 50
			err = sb.apply(env)
			if took := err == nil; took != c.took {
				t.Fatalf("apply: %v; taken %v, want %v", err, took, c.took)
			}
			if !c.took {
				if sb.Seq != before.Seq || sb.View.Restore != before.View.Restore || sb.RestoreRef != before.RestoreRef {
					t.Fatalf("a refused note moved the aggregate: seq %d restore %+v, was %d %+v", sb.Seq, sb.View.Restore, before.Seq, before.View.Restore)
				}
				return
			}
			if !sb.View.Restore.Movable || sb.View.Restore.MovableBytes != 42 {
				t.Fatalf("view restore %+v, want movable, 42 bytes", sb.View.Restore)
			}
		})
	}
}
