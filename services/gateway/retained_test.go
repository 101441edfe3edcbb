package gateway

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// TestRetainedWorkloadDiesAfterAFailedResume (issue 24, hole 5): a resume
// raises the current generation to 2 and fails without consuming the
// state, so the sandbox is suspended again on generation 1's frozen
// workload. That workload's reports are still its sandbox's: its
// supervisor's heartbeat is taken, and its death is recorded, the exit
// code kept and the retained state invalidated in the same append
// (CONTRACT §1), while a report of the failed resume's generation is
// fenced. The exit used to be refused ("speaks for generation 1, current
// is 2"), leaving the view suspended and held on a dead group.
func TestRetainedWorkloadDiesAfterAFailedResume(t *testing.T) {
	r := newRig(t)
	svc := r.service(t)
	ctx := context.Background()
	v := readySandbox(t, svc)
	last := func(typ string) events.Envelope {
		t.Helper()
		envs, err := r.store.Load(ctx, v.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := len(envs) - 1; i >= 0; i-- {
			if envs[i].Type == typ {
				return envs[i]
			}
		}
		t.Fatalf("no %s in the log", typ)
		return events.Envelope{}
	}
	if _, err := svc.Handle(ctx, Command{Verb: VerbSuspend, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Record(ctx, last(events.TypeSuspendRequested), "sagas", &events.Suspended{Generation: 1, RestoreRef: "ref-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Handle(ctx, Command{Verb: VerbResume, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Record(ctx, last(events.TypeResumeRequested), "sagas", &events.ResumeFailed{Generation: 2, Message: "restore failed, ref-1 kept"}); err != nil {
		t.Fatal(err)
	}
	report := func(gen int64, kind string, code int) error {
		t.Helper()
		data, err := json.Marshal(compute.Report{SandboxID: v.ID, Generation: gen, Credential: r.creds.Mint(v.ID, gen), Kind: kind, ExitCode: code})
		if err != nil {
			t.Fatal(err)
		}
		_, err = svc.Report(ctx, v.ID, data)
		return err
	}
	if sb, err := svc.Sandbox(ctx, v.ID); err != nil || sb.Phase != events.PhaseSuspended || sb.Generation != 2 || !sb.View.Restore.Held {
		t.Fatalf("after the failed resume: %+v, %v; want suspended at generation 2, the state held", sb, err)
	}

	if err := report(1, compute.ReportHeartbeat, 0); err != nil {
		t.Errorf("heartbeat of the retained workload's supervisor: %v, want taken", err)
	}
	if err := report(2, compute.ReportExited, 9); events.CodeOf(err) != events.CodeFailedPrecondition {
		t.Errorf("exit of the failed resume's generation: %v, want FAILED_PRECONDITION (fenced)", err)
	}
	if err := report(1, compute.ReportExited, 7); err != nil {
		t.Fatalf("exit of the retained workload: %v, want recorded", err)
	}
	sb, err := svc.Sandbox(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := sb.View; got.Phase != events.PhaseError || got.ExitCode == nil || *got.ExitCode != 7 || got.Restore.Held {
		t.Fatalf("after the retained workload's exit: phase %s, exit code %v, restore %+v; want error, 7, nothing held", got.Phase, got.ExitCode, got.Restore)
	}
	envs, err := r.store.Load(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var tail []string
	for _, e := range envs[len(envs)-2:] {
		tail = append(tail, e.Type)
	}
	if want := []string{events.TypeExited, events.TypeRetainedStateInvalidated}; tail[0] != want[0] || tail[1] != want[1] {
		t.Fatalf("the log ends %v, want %v", tail, want)
	}
}
