package sagas_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/remote"
)

// mover is the sim as the driver of two nodes that moves retained state
// between them: Export of a reference gives "moved:"+ref, a Resume of that
// restores ref on the sim. Discard and Delete are recorded by node (a
// discard is not passed on: the old node's copy is the test's own). A node
// marked down answers nothing (ErrUnavailable: the call may have reached
// it); one marked unserved is served by nobody (ErrNotDelivered: no call
// reaches it); downAfterExport marks the exporting node down once it
// exported.
type mover struct {
	full
	downAfterExport bool
	// lost: a resume on another node restores there, and its answer is
	// lost (ErrUnavailable); on is the node the sim's sandbox is on, which
	// alone can say what is true of it (Observe elsewhere knows nothing).
	lost    bool
	on      string
	changed func() // called after each call, for the test's waits

	mu       sync.Mutex
	down     map[string]bool
	unserved map[string]bool
	calls    []string // "discard n1 REF", "delete n2", each answered call
	tries    map[string]int
}

func newMover(h *harness) *mover {
	return &mover{full: h.sim, changed: h.store.notify, down: map[string]bool{}, unserved: map[string]bool{}, tries: map[string]int{}}
}

func (m *mover) enter(op, node string) error {
	defer m.changed()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tries[op+" "+node]++
	return m.unreached(op, node)
}

// unreached is the error of a call of op to node that is unserved or down;
// m.mu is held.
func (m *mover) unreached(op, node string) error {
	switch {
	case m.unserved[node]:
		return fmt.Errorf("%s on %s: no responders: %w", op, node, compute.ErrNotDelivered)
	case m.down[node]:
		return fmt.Errorf("%s on %s: no answer: %w", op, node, compute.ErrUnavailable)
	}
	return nil
}

func (m *mover) setDown(node string, down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down[node] = down
}

func (m *mover) setUnserved(node string, unserved bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.unserved[node] = unserved
}

func (m *mover) record(call string) {
	defer m.changed()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, call)
}

func (m *mover) answered() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

func (m *mover) tried(call string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tries[call]
}

func (m *mover) Capabilities(opts map[string]string) compute.Capabilities {
	c := m.full.Capabilities(opts)
	c.ResumeElsewhere = true
	return c
}

func (m *mover) Export(ctx context.Context, spec compute.Spec, ref string) (string, error) {
	if err := m.enter("export", spec.Node); err != nil {
		return "", err
	}
	if m.downAfterExport {
		m.setDown(spec.Node, true)
	}
	return "moved:" + ref, nil
}

func (m *mover) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	if err := m.enter("resume", req.Spec.Node); err != nil {
		return compute.ResumeResult{}, err
	}
	req.RestoreRef = strings.TrimPrefix(req.RestoreRef, "moved:")
	res, err := m.full.Resume(ctx, req)
	if err == nil {
		m.mu.Lock()
		m.on = req.Spec.Node
		m.mu.Unlock()
		if m.lost {
			return compute.ResumeResult{}, fmt.Errorf("resume on %s: the answer is lost: %w", req.Spec.Node, compute.ErrUnavailable)
		}
	}
	return res, err
}

func (m *mover) Observe(ctx context.Context, spec compute.Spec) (compute.Observation, error) {
	m.mu.Lock()
	on, err := m.on, m.unreached("observe", spec.Node)
	m.mu.Unlock()
	if err != nil {
		return compute.Observation{}, err
	}
	if on != "" && spec.Node != on {
		return compute.Observation{}, fmt.Errorf("observe on %s: %w", spec.Node, compute.ErrUnavailable)
	}
	return m.full.Observe(ctx, spec)
}

func (m *mover) Stop(ctx context.Context, t compute.Target) error {
	if err := m.enter("stop", t.Spec.Node); err != nil {
		return err
	}
	m.record(fmt.Sprintf("stop %s %d", t.Spec.Node, t.Generation))
	return m.full.Stop(ctx, t)
}

func (m *mover) Discard(ctx context.Context, spec compute.Spec, ref string) error {
	if err := m.enter("discard", spec.Node); err != nil {
		return err
	}
	m.record("discard " + spec.Node + " " + ref)
	return nil
}

func (m *mover) Delete(ctx context.Context, spec compute.Spec) error {
	if err := m.enter("delete", spec.Node); err != nil {
		return err
	}
	m.record("delete " + spec.Node)
	return m.full.Delete(ctx, spec)
}

// TestMoveLeavesNothingBehind: a resume on another node whose old node is
// down when the saga tells it to discard its copy asks it again until it
// answers; the delete then tells both nodes, the one the sandbox is on and
// the one it moved away from.
func TestMoveLeavesNothingBehind(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	m.downAfterExport = true
	h.run(m)
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	sb.then(sb.outcome(in, 2),
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref, Node: "n2", Via: "moved:" + ref},
		&events.Resumed{Generation: 2, Outcome: events.OutcomeRestored})
	h.store.waitUntil(t, "the down node asked again", func() bool { return m.tried("discard "+node) >= 3 })
	if got := m.answered(); len(got) != 0 {
		t.Fatalf("answered calls while the old node is down: %v", got)
	}
	m.setDown(node, false)
	want := "discard " + node + " " + ref
	h.store.waitUntil(t, "the old node discards its copy", func() bool { return slices.Contains(m.answered(), want) })
	sb.then(sb.outcome(sb.when(&events.DeleteRequested{}), 1), &events.Deleted{})
	got := m.answered()
	if !slices.Contains(got, "delete n2") || !slices.Contains(got, "delete "+node) {
		t.Fatalf("calls %v: want a delete on n2 (the sandbox's node) and on %s (the one it moved away from)", got, node)
	}
}

// TestDeleteWithAFormerNodeDown: a node the sandbox moved away from that
// is down at its delete holds up nothing: the sandbox is deleted.
func TestDeleteWithAFormerNodeDown(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	h.run(m)
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	sb.outcome(in, 2)
	m.setDown(node, true)
	sb.then(sb.outcome(sb.when(&events.DeleteRequested{}), 1), &events.Deleted{})
	if m.tried("delete "+node) != 1 || !slices.Contains(m.answered(), "delete n2") {
		t.Fatalf("%d tries on %s, answered %v: want one try on the down %s and a delete on n2", m.tried("delete "+node), node, m.answered(), node)
	}
}

// TestMoveDeadlineAsksTheTarget: a resume on another node that restored
// there while every answer of it was lost is, at its deadline, what the
// target says: the state consumed there (the sandbox on the target from
// then on) and restored, recorded as the saga would have; then, its
// supervisor given the grace and never attached (this harness records no
// report), the deadline passed, and the target's copy stopped; not a
// resume failure that would hold the state for a second restore.
func TestMoveDeadlineAsksTheTarget(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}, Deadline: short})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	m.lost = true
	h.run(m)
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	sb.then(sb.outcome(in, 3),
		&events.RetainedStateConsumed{Generation: 2, RestoreRef: ref, Node: "n2"},
		&events.Resumed{Generation: 2, Outcome: events.OutcomeRestored},
		passed(events.PhaseStarting), stopAfter(2))
	h.store.waitUntil(t, "the clean-up stop on n2", func() bool { return slices.Contains(m.answered(), "stop n2 2") })
}

// TestMoveDeadlineTargetCannotTell (issue 24, hole 2): a resume on another
// node that does not answer, nor say at the deadline what it did, may have
// restored the moved state there: the state still held on the sandbox's
// own node proves nothing, and the sandbox ends in error, not suspended
// for a second restore that could run the workload twice.
func TestMoveDeadlineTargetCannotTell(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}, Deadline: short})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	m.setDown("n2", true)
	h.run(m)
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	sb.then(sb.outcome(in, 1), passed(events.PhaseStarting), stopAfter(2))
	if o, _ := h.sim.Observe(context.Background(), compute.Spec{SandboxID: sb.id}); o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("the sim observes %+v, want the state still held behind %s (the delete invalidates it)", o, ref)
	}
}

// caughtUp waits until the runner has read the log to its head: an intent
// appended from now on is one no runner before it could have driven.
func (h *harness) caughtUp() {
	h.t.Helper()
	last, err := h.store.LastSeq(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	h.store.waitUntil(h.t, "the runner to read the log to its head", func() bool { return h.store.followed() >= last })
}

// TestMoveDeadlineTargetNeverReached (issue 24, hole 2, a move): a resume
// on another node that nobody serves (every call to it delivered to no
// driver: NATS's no responders) waits for it until the deadline, which
// finds the target unable to tell what it did; but no resume ever reached
// it, so it consumed nothing, and the state held on the sandbox's own node
// decides: back to suspended there, held. It used to end in error, the
// retained state lost to the user.
func TestMoveDeadlineTargetNeverReached(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}, Deadline: short})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	m.setUnserved("n2", true)
	h.run(m)
	h.caughtUp()
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	sb.then(sb.outcome(in, 2), &events.ResumeFailed{Generation: 2}, passed(events.PhaseStarting))
	if m.tried("resume n2") == 0 {
		t.Fatal("no resume was sent to n2")
	}
	if o, _ := h.sim.Observe(context.Background(), compute.Spec{SandboxID: sb.id}); o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("the sim observes %+v, want the state still held behind %s", o, ref)
	}
}

// TestMoveDeadlineTargetReachedOnce: a resume on another node whose first
// call may have reached the target (no answer in time), and every later
// one reached no driver, may have restored there: the deadline ends in
// error, as when the target never says (TestMoveDeadlineTargetCannotTell).
func TestMoveDeadlineTargetReachedOnce(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}, Deadline: short})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	m.setDown("n2", true)
	h.run(m)
	h.caughtUp()
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	h.store.waitUntil(t, "a resume sent to n2", func() bool { return m.tried("resume n2") >= 1 })
	m.setUnserved("n2", true)
	sb.then(sb.outcome(in, 1), passed(events.PhaseStarting), stopAfter(2))
}

// TestMoveDeadlineUnservedOnTheBus is TestMoveDeadlineTargetNeverReached
// with the target a driver on a real NATS bus that no `torpor driver`
// serves (services/compute/remote): its no responders is the proof that
// no resume reached it.
func TestMoveDeadlineUnservedOnTheBus(t *testing.T) {
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}, Deadline: short})
	sb, ref := h.suspended(nil)
	srv := natstest.Start(t)
	routed := &compute.Routed{Local: node, Here: newMover(h), There: func(n string) compute.Driver {
		return remote.NewClient(srv.Conn, n, "sim")
	}}
	h.run(routed)
	h.caughtUp()
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	sb.then(sb.outcome(in, 2), &events.ResumeFailed{Generation: 2}, passed(events.PhaseStarting))
	if o, _ := h.sim.Observe(context.Background(), compute.Spec{SandboxID: sb.id}); o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("the sim observes %+v, want the state still held behind %s", o, ref)
	}
}

// TestMoveDeadlineAfterARestart: what a runner knows of the resumes it
// sent is memory only. A runner that sent one that may have reached the
// target stops; the next one re-drives the resume, and none of its own
// calls reaches the target: it cannot know of the first runner's, so the
// deadline ends in error, as when the target never says.
func TestMoveDeadlineAfterARestart(t *testing.T) {
	const deadline = time.Second
	h := newHarness(t, sagas.Config{Nodes: []string{"n2"}, Deadline: deadline})
	sb, ref := h.suspended(nil)
	m := newMover(h)
	m.setDown("n2", true)
	stop := h.run(m)
	h.caughtUp()
	in := sb.when(&events.ResumeRequested{Generation: 2, RestoreRef: ref, Node: "n2"})
	h.store.waitUntil(t, "a resume sent to n2", func() bool { return m.tried("resume n2") >= 1 })
	stop()
	m.setUnserved("n2", true)
	h.run(m)
	sb.then(sb.outcome(in, 1), &events.DeadlinePassed{Phase: events.PhaseStarting, Deadline: deadline.String()}, stopAfter(2))
}
