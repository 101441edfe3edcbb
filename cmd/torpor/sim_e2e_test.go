package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// TestSimBehavioursEndToEnd drives each sim option of CONTRACT §8 through the
// real wiring and checks where the sandbox ends and what its view says.
func TestSimBehavioursEndToEnd(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) { c.Deadline = 2 * time.Second })
	c := appClient(a)
	ctx := context.Background()
	code := func(n int) *int { return &n }

	cases := []struct {
		name    string
		opts    map[string]string
		verbs   []string // run in order; each but the last waits for the phase in after
		restart bool     // resume with restart_if_restore_fails
		phase   events.Phase
		check   func(t *testing.T, v events.View)
	}{
		{"suspend rejected keeps it running", map[string]string{"suspend": "reject"}, []string{"suspend"}, false, events.PhaseReady,
			func(t *testing.T, v events.View) {
				if v.LastOutcome != events.OutcomeSuspendRejected || v.Reason != events.ReasonSuspendRejected || v.Restore.Held {
					t.Errorf("view %+v", v)
				}
			}},
		{"suspend hangs past the deadline", map[string]string{"suspend": "hang"}, []string{"suspend"}, false, events.PhaseReady,
			func(t *testing.T, v events.View) {
				if v.LastOutcome != events.OutcomeSuspendTimedOut || v.Reason != events.ReasonDeadlineExceeded {
					t.Errorf("view %+v", v)
				}
			}},
		{"an exit racing the suspension wins", map[string]string{"exit_during_suspend": "3"}, []string{"suspend"}, false, events.PhaseError,
			func(t *testing.T, v events.View) {
				if v.ExitCode == nil || *v.ExitCode != *code(3) || v.Reason != events.ReasonMainProcessExited || v.Restore.Held {
					t.Errorf("view %+v", v)
				}
			}},
		{"restore fails before consuming: suspended, retryable", map[string]string{"resume": "fail"}, []string{"suspend", "resume"}, false, events.PhaseSuspended,
			func(t *testing.T, v events.View) {
				if v.LastOutcome != events.OutcomeRestoreFailed || !v.Restore.Held || v.Restore.Consumed {
					t.Errorf("view %+v", v)
				}
			}},
		{"restore fails once, then a retry restores", map[string]string{"resume": "fail_once"}, []string{"suspend", "resume:suspended", "resume"}, false, events.PhaseReady,
			func(t *testing.T, v events.View) {
				if v.LastOutcome != events.OutcomeRestored || !v.Restore.Consumed || v.Generation != 3 {
					t.Errorf("view %+v", v)
				}
			}},
		{"restore fails after consuming, strict: stopped", map[string]string{"resume": "fail_after_consume"}, []string{"suspend", "resume"}, false, events.PhaseStopped,
			func(t *testing.T, v events.View) {
				if v.Reason != events.ReasonRetainedStateLost || v.Restore.Held || !v.Restore.Consumed {
					t.Errorf("view %+v", v)
				}
			}},
		{"restore fails after consuming, fallback: cold start", map[string]string{"resume": "fail_after_consume"}, []string{"suspend", "resume"}, true, events.PhaseReady,
			func(t *testing.T, v events.View) {
				if v.LastOutcome != events.OutcomeColdStartFallback || v.Restore.Held || v.Generation != 3 {
					t.Errorf("view %+v", v)
				}
			}},
		{"the workload exits on its own", map[string]string{"exit_after": "20ms", "exit_code": "7"}, nil, false, events.PhaseError,
			func(t *testing.T, v events.View) {
				if v.ExitCode == nil || *v.ExitCode != 7 || v.Reason != events.ReasonMainProcessExited {
					t.Errorf("view %+v", v)
				}
			}},
	}
	// A verb waits for its usual phase, or for the one after its colon.
	after := map[string]events.Phase{"suspend": events.PhaseSuspended, "resume": events.PhaseReady}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := c.Create(ctx, torpor.CreateRequest{DriverOptions: tc.opts}, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(tc.verbs) > 0 {
				mustWait(t, c, v.ID, events.PhaseReady)
			}
			var seen uint64 // the seq the last command answered with
			for i, step := range tc.verbs {
				verb, then, ok := strings.Cut(step, ":")
				if !ok {
					then = string(after[verb])
				}
				accepted, err := c.Lifecycle(ctx, verb, v.ID, tc.restart && verb == "resume", "")
				if err != nil {
					t.Fatalf("%s: %v", verb, err)
				}
				seen = accepted.Seq
				if i < len(tc.verbs)-1 {
					// After the command's own events: the view from before it
					// may be in the phase waited for (suspended, say).
					if _, err := c.WaitAfter(ctx, v.ID, events.Phase(then), accepted.Seq, waitFor); err != nil {
						t.Fatalf("%s: wait for %s: %v", verb, then, err)
					}
				}
			}
			got, err := c.WaitAfter(ctx, v.ID, tc.phase, seen, waitFor)
			if err != nil {
				t.Fatalf("wait for %s: %v (view %+v)", tc.phase, err, got)
			}
			tc.check(t, got)
		})
	}
}
