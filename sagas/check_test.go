package sagas_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
)

// asker is a compute.Checker that answers what answer says and notes each
// question ("node ref").
type asker struct {
	answer func(spec compute.Spec, ref string) error

	mu   sync.Mutex
	asks []string
}

func (a *asker) CanRestore(ctx context.Context, spec compute.Spec, ref string) error {
	a.mu.Lock()
	a.asks = append(a.asks, spec.Node+" "+ref)
	a.mu.Unlock()
	return a.answer(spec, ref)
}

func (a *asker) asked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.asks)
}

// lacking refuses every restore as a node without machine type pc-q35-9.2.
func lacking(spec compute.Spec, _ string) error {
	return fmt.Errorf("%w: the snapshot's machine type pc-q35-9.2 is not in QEMU 7.2.22 on node %s", compute.ErrRejected, spec.Node)
}

// checking is the sim with a Checker.
type checking struct {
	full
	*asker
}

// checkingMover is the mover with a Checker.
type checkingMover struct {
	*mover
	*asker
}

// frozen fails unless the sim still holds sb's state behind ref.
func (h *harness) frozen(sb *sandbox, ref string) {
	h.t.Helper()
	if o, _ := h.sim.Observe(context.Background(), compute.Spec{SandboxID: sb.id}); o.State != compute.StateFrozen || o.RestoreRef != ref {
		h.t.Fatalf("the sim observes %+v, want the state still held behind %s", o, ref)
	}
}

// refusedWith checks the one outcome of a refused resume: resume_failed
// from node, its message saying why.
func (sb *sandbox) refusedWith(got []events.Event, node, why string) {
	sb.h.t.Helper()
	if f, ok := got[0].(*events.ResumeFailed); !ok || !strings.Contains(f.Message, why) {
		sb.h.t.Fatalf("outcome %#v, want a resume_failed saying %q", got[0], why)
	}
	sb.then(got, &events.ResumeFailed{Generation: 2, Node: node, Reason: events.ReasonCannotRestore})
}

// TestResumeTargetRefuses (issue 29): a target that says it cannot restore
// the state is asked before anything is consumed: the resume fails with
// its reason, the state still held (the sim never asked to restore it),
// the sandbox suspended again with the reason in its view.
func TestResumeTargetRefuses(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(nil)
	a := &asker{answer: lacking}
	h.run(&checking{full: h.sim, asker: a})
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.refusedWith(sb.outcome(in, 1), node, "machine type pc-q35-9.2")
	h.frozen(sb, ref)
	if got, want := a.asked(), []string{node + " " + ref}; !slices.Equal(got, want) {
		t.Errorf("asked %v, want %v", got, want)
	}
	v := view(t, h, sb)
	if v.Phase != events.PhaseSuspended || !v.Restore.Held || v.Restore.Consumed || v.Reason != events.ReasonCannotRestore || v.LastOutcome != events.OutcomeRestoreFailed {
		t.Errorf("view %+v: want suspended, held, not consumed, reason %s, outcome %s", v, events.ReasonCannotRestore, events.OutcomeRestoreFailed)
	}
}

// view folds sb's log as the views do.
func view(t *testing.T, h *harness, sb *sandbox) events.View {
	t.Helper()
	log, err := h.store.Load(context.Background(), sb.id, 0)
	if err != nil {
		t.Fatal(err)
	}
	var v events.View
	for _, env := range log {
		if _, err := v.Apply(env); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// TestResumeTargetAccepts: a target that can restore the state is asked,
// with the reference it will restore, and the resume goes on as before.
func TestResumeTargetAccepts(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(nil)
	a := &asker{answer: func(compute.Spec, string) error { return nil }}
	h.run(&checking{full: h.sim, asker: a})
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.then(sb.outcome(in, 2),
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref},
		&events.Resumed{Generation: 2, Outcome: events.OutcomeRestored})
	if got, want := a.asked(), []string{node + " " + ref}; !slices.Equal(got, want) {
		t.Errorf("asked %v, want %v", got, want)
	}
}

// TestResumeWithoutChecker: a driver that is no Checker is not asked, and
// its resume goes on as before.
func TestResumeWithoutChecker(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(nil)
	h.run(h.sim)
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.then(sb.outcome(in, 2),
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref},
		&events.Resumed{Generation: 2, Outcome: events.OutcomeRestored})
}

// TestResumeRefusalAskedOnce: a refusal whose record fails (the bus down
// through every attempt of the step) is recorded when the step comes
// again, without asking the target again: one resume, one question.
func TestResumeRefusalAskedOnce(t *testing.T) {
	h := newHarness(t, sagas.Config{})
	sb, ref := h.suspended(nil)
	a := &asker{answer: lacking}
	h.rec.unavailable = 9 // the first step's 8 attempts, and one more
	h.run(&checking{full: h.sim, asker: a})
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref})
	sb.refusedWith(sb.outcome(in, 1), node, "pc-q35-9.2")
	if got := h.rec.callsOf(events.TypeResumeFailed); got != 10 {
		t.Errorf("%d records of the refusal, want 10 (9 unavailable, then recorded)", got)
	}
	if got := a.asked(); len(got) != 1 {
		t.Errorf("the target was asked %d times (%v), want once", len(got), got)
	}
	h.frozen(sb, ref)
}

// TestMoveTargetRefuses: a resume on another node asks the target about
// the moved reference, after the export and before any resume; refused,
// no resume reaches it, nothing is discarded, the state held on the old
// node, the sandbox still on it.
func TestMoveTargetRefuses(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	a := &asker{answer: lacking}
	h.run(&checkingMover{mover: m, asker: a})
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	sb.refusedWith(sb.outcome(in, 1), "n2", "node n2")
	if got, want := a.asked(), []string{"n2 moved:" + ref}; !slices.Equal(got, want) {
		t.Errorf("asked %v, want %v", got, want)
	}
	if m.tried("resume n2") != 0 || len(m.answered()) != 0 {
		t.Errorf("after the refusal: %d resumes sent to n2, calls %v; want none", m.tried("resume n2"), m.answered())
	}
	h.frozen(sb, ref)
	if v := view(t, h, sb); v.Node != node || v.Phase != events.PhaseSuspended {
		t.Errorf("view %+v: want suspended on %s", v, node)
	}
}

// TestResumeAsksBeforeItsFirstTryOnly: the target is asked before the
// first resume is sent, not again while resumes go unanswered (one may
// have reached it, and restored).
func TestResumeAsksBeforeItsFirstTryOnly(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	m.setDown("n2", true)
	a := &asker{answer: func(compute.Spec, string) error { return nil }}
	h.run(&checkingMover{mover: m, asker: a})
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	h.store.waitUntil(t, "two resumes sent to n2", func() bool { return m.tried("resume n2") >= 2 })
	m.setDown("n2", false)
	sb.then(sb.outcome(in, 2),
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref, Node: "n2", Via: "moved:" + ref},
		&events.Resumed{Generation: 2, Outcome: events.OutcomeRestored})
	if got, want := a.asked(), []string{"n2 moved:" + ref}; !slices.Equal(got, want) {
		t.Errorf("asked %v, want %v (once, before the first resume)", got, want)
	}
}
