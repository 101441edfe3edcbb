package torpor_test

import (
	"errors"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// TestHTTPCommandWaitsForItsOutcome: CreateWait and LifecycleWait answer, in
// one call, the view once the command's outcome is in it — ready after a
// create, each verb's target, ready again after a suspend the driver
// rejects — a refused command its error, and at the timeout
// ErrDeadlineExceeded with the view as it is (a suspend that hangs:
// suspending).
func TestHTTPCommandWaitsForItsOutcome(t *testing.T) {
	ctx := ctxFor(t)
	c := client()
	v, err := c.CreateWait(ctx, sim(), "", 0)
	if err != nil || v.Phase != events.PhaseReady {
		t.Fatalf("create: %+v, %v; want ready", v, err)
	}
	id := v.ID
	for _, step := range []struct {
		verb string
		o    torpor.ResumeOptions
		want events.Phase
	}{
		{torpor.VerbStop, torpor.ResumeOptions{}, events.PhaseStopped},
		{torpor.VerbStart, torpor.ResumeOptions{}, events.PhaseReady},
		{torpor.VerbSuspend, torpor.ResumeOptions{}, events.PhaseSuspended},
		{torpor.VerbResume, torpor.ResumeOptions{RestartIfRestoreFails: true}, events.PhaseReady},
		{torpor.VerbDelete, torpor.ResumeOptions{}, events.PhaseDeleted},
	} {
		got, err := c.LifecycleWait(ctx, step.verb, id, step.o, "", 10*time.Second)
		if err != nil || got.Phase != step.want || got.ID != id || got.Seq <= v.Seq {
			t.Fatalf("%s: %+v, %v; want %s above seq %d", step.verb, got, err, step.want, v.Seq)
		}
		v = got
	}
	if _, err := c.LifecycleWait(ctx, torpor.VerbSuspend, id, torpor.ResumeOptions{}, "", 10*time.Second); !errors.Is(err, torpor.ErrFailedPrecondition) {
		t.Fatalf("suspend of a deleted sandbox: %v, want FAILED_PRECONDITION", err)
	}

	rejects, err := c.CreateWait(ctx, sim("suspend", "reject"), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.LifecycleWait(ctx, torpor.VerbSuspend, rejects.ID, torpor.ResumeOptions{}, "", 10*time.Second); err != nil ||
		got.Phase != events.PhaseReady || got.LastOutcome != "suspend_rejected" {
		t.Fatalf("a suspend the driver rejects: %+v, %v; want ready, suspend_rejected", got, err)
	}

	hangs, err := c.CreateWait(ctx, sim("suspend", "hang"), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.LifecycleWait(ctx, torpor.VerbSuspend, hangs.ID, torpor.ResumeOptions{}, "", 300*time.Millisecond)
	if !errors.Is(err, torpor.ErrDeadlineExceeded) || got.Phase != events.PhaseSuspending || got.ID != hangs.ID {
		t.Fatalf("a suspend that hangs: %+v, %v; want DEADLINE_EXCEEDED with the view suspending", got, err)
	}
}
