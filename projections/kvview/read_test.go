package kvview

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
)

// fleet creates sandboxes in order, each with the labels and final phase
// given, and returns their ids in creation order.
type member struct {
	labels map[string]string
	phase  events.Phase
}

func fleet(t *testing.T, v *View, members ...member) []string {
	t.Helper()
	ids := make([]string, len(members))
	seq := uint64(0)
	for i, m := range members {
		ids[i] = newID(t)
		seq++
		apply(t, v, env(t, ids[i], seq, events.PhaseProvisioning, created(ids[i], m.labels)))
		// The events the table takes on the way to the member's phase.
		var path []events.Event
		switch m.phase {
		case events.PhaseReady:
			path = []events.Event{&events.SupervisorAttached{Generation: 1}}
		case events.PhaseDeleted:
			path = []events.Event{&events.DeleteRequested{}, &events.Deleted{}}
		}
		for _, e := range path {
			seq++
			apply(t, v, env(t, ids[i], seq, m.phase, e))
		}
	}
	return ids
}

func ids(vs []events.View) []string {
	out := []string{}
	for _, v := range vs {
		out = append(out, v.ID)
	}
	return out
}

func TestList(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	all := fleet(t, v,
		member{map[string]string{"team": "a"}, events.PhaseReady},
		member{map[string]string{"team": "b"}, events.PhaseProvisioning},
		member{map[string]string{"team": "a"}, events.PhaseDeleted},
		member{nil, events.PhaseReady},
		member{map[string]string{"team": "a", "x": ""}, events.PhaseReady},
	)
	ctx := context.Background()
	tests := []struct {
		name string
		q    Query
		want []string
	}{
		{"all in creation order, deleted included", Query{}, all},
		{"phase", Query{Phase: events.PhaseReady}, []string{all[0], all[3], all[4]}},
		{"deleted", Query{Phase: events.PhaseDeleted}, []string{all[2]}},
		{"label", Query{Label: "team=a"}, []string{all[0], all[2], all[4]}},
		{"empty label value", Query{Label: "x="}, []string{all[4]}},
		{"phase and label", Query{Phase: events.PhaseReady, Label: "team=a"}, []string{all[0], all[4]}},
		{"nothing matches", Query{Label: "team=z"}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, err := v.List(ctx, tt.q)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if got := ids(page.Items); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ids = %v, want %v", got, tt.want)
			}
			if page.Next != "" {
				t.Errorf("next = %q, want empty", page.Next)
			}
		})
	}
}

func TestListEmpty(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	page, err := v.List(context.Background(), Query{})
	if err != nil || page.Items == nil || len(page.Items) != 0 || page.Next != "" {
		t.Errorf("List(empty bucket) = %+v, %v; want no items, no next", page, err)
	}
}

func TestListPages(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	ready := member{map[string]string{"team": "a"}, events.PhaseReady}
	other := member{nil, events.PhaseProvisioning}
	all := fleet(t, v, ready, other, ready, ready, other, ready, ready, other)
	wantReady := []string{all[0], all[2], all[3], all[5], all[6]}

	for _, tt := range []struct {
		name string
		q    Query
		want []string
	}{
		{"unfiltered", Query{Limit: 3}, all},
		{"filtered", Query{Limit: 2, Phase: events.PhaseReady}, wantReady},
		{"page size of the total", Query{Limit: 5, Phase: events.PhaseReady}, wantReady},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			q := tt.q
			for pages := 0; ; pages++ {
				if pages > len(all) {
					t.Fatal("paging does not end")
				}
				page, err := v.List(context.Background(), q)
				if err != nil {
					t.Fatalf("List: %v", err)
				}
				if len(page.Items) > q.Limit {
					t.Errorf("page of %d, limit %d", len(page.Items), q.Limit)
				}
				got = append(got, ids(page.Items)...)
				if page.Next == "" {
					break
				}
				q.Cursor = page.Next
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ids over all pages = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestListInvalid(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	for _, q := range []Query{
		{Cursor: "%%%"},
		{Cursor: "Kg"}, // base64 of "*"
		{Label: "team"},
		{Label: "=a"},
		{Phase: "sleeping"},
		{Limit: -1},
	} {
		_, err := v.List(context.Background(), q)
		if got := events.CodeOf(err); got != events.CodeInvalidArgument {
			t.Errorf("List(%+v) code = %q (%v), want %s", q, got, err, events.CodeInvalidArgument)
		}
	}
}

func TestCounts(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	fleet(t, v,
		member{nil, events.PhaseReady},
		member{nil, events.PhaseReady},
		member{nil, events.PhaseProvisioning},
		member{nil, events.PhaseDeleted},
	)
	got, err := v.Counts(context.Background())
	if err != nil {
		t.Fatalf("Counts: %v", err)
	}
	want := map[events.Phase]int{}
	for _, p := range events.Phases {
		want[p] = 0
	}
	want[events.PhaseReady], want[events.PhaseProvisioning], want[events.PhaseDeleted] = 2, 1, 1
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Counts = %v, want %v", got, want)
	}
}

func TestWaitAlreadyThere(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := fleet(t, v, member{nil, events.PhaseReady})[0]
	got, err := v.Wait(context.Background(), id, events.PhaseReady, 0)
	if err != nil || got.Phase != events.PhaseReady || got.ID != id {
		t.Errorf("Wait = %+v, %v; want the ready view", got, err)
	}
}

type waited struct {
	view events.View
	err  error
}

func waitAsync(ctx context.Context, v *View, id string, p events.Phase) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		view, err := v.Wait(ctx, id, p, 0)
		ch <- waited{view, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan waited) waited {
	t.Helper()
	select {
	case w := <-ch:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return in 10s")
		return waited{}
	}
}

func TestWaitForLaterApply(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := fleet(t, v, member{nil, events.PhaseProvisioning})[0]
	ch := waitAsync(context.Background(), v, id, events.PhaseReady)
	apply(t, v, env(t, id, 10, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	w := receive(t, ch)
	if w.err != nil || w.view.Phase != events.PhaseReady || w.view.Seq != 10 {
		t.Errorf("Wait = %+v, %v; want ready at seq 10", w.view, w.err)
	}
}

func TestWaitForUnprojectedID(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	ch := waitAsync(context.Background(), v, id, events.PhaseReady)
	apply(t, v,
		env(t, id, 1, events.PhaseProvisioning, created(id, nil)),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
	)
	if w := receive(t, ch); w.err != nil || w.view.Phase != events.PhaseReady {
		t.Errorf("Wait = %+v, %v; want ready", w.view, w.err)
	}
}

func TestWaitTimeout(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := fleet(t, v, member{nil, events.PhaseProvisioning})[0]
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	got, err := v.Wait(ctx, id, events.PhaseReady, 0)
	if !errors.Is(err, context.DeadlineExceeded) || events.CodeOf(err) != events.CodeDeadlineExceeded {
		t.Errorf("Wait err = %v, want one wrapping context.DeadlineExceeded", err)
	}
	if got.Phase != events.PhaseProvisioning || got.ID != id {
		t.Errorf("Wait view = %+v, want the last one seen (provisioning)", got)
	}
}

func TestWaitTerminal(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := fleet(t, v, member{nil, events.PhaseProvisioning})[0]
	ch := waitAsync(context.Background(), v, id, events.PhaseReady)
	apply(t, v, env(t, id, 10, events.PhaseError, &events.Exited{Generation: 1, Code: 3}))
	w := receive(t, ch)
	if got := events.CodeOf(w.err); got != events.CodeFailedPrecondition {
		t.Errorf("Wait code = %q (%v), want %s", got, w.err, events.CodeFailedPrecondition)
	}
	if w.view.Phase != events.PhaseError || w.view.ExitCode == nil || *w.view.ExitCode != 3 {
		t.Errorf("Wait view = %+v, want the error view with exit code 3", w.view)
	}

	// Waiting for the terminal phase itself succeeds.
	if got, err := v.Wait(context.Background(), id, events.PhaseError, 0); err != nil || got.Phase != events.PhaseError {
		t.Errorf("Wait(error) = %+v, %v; want the error view", got, err)
	}
}

func TestWatch(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	a, b := newID(t), newID(t)
	apply(t, v,
		env(t, a, 1, events.PhaseProvisioning, created(a, nil)),
		env(t, b, 2, events.PhaseProvisioning, created(b, nil)),
		env(t, a, 3, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
	)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := v.Watch(ctx, 2)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	next := func() events.View {
		t.Helper()
		select {
		case view, ok := <-ch:
			if !ok {
				t.Fatal("watch closed early")
			}
			return view
		case <-time.After(10 * time.Second):
			t.Fatal("no view in 10s")
			return events.View{}
		}
	}
	// b (seq 2) is at or below afterSeq: only a's current view comes first.
	if got := next(); got.ID != a || got.Seq != 3 {
		t.Errorf("first = %s@%d, want %s@3", got.ID, got.Seq, a)
	}
	apply(t, v, env(t, b, 4, events.PhaseReady, &events.SupervisorAttached{Generation: 1}))
	if got := next(); got.ID != b || got.Seq != 4 || got.Phase != events.PhaseReady {
		t.Errorf("change = %s@%d %s, want %s@4 ready", got.ID, got.Seq, got.Phase, b)
	}

	cancel()
	for range ch { // closed when ctx ends
	}
}

// TestWaitAfter: a view at or below after does not answer a wait, even in
// the phase waited for; the next one in that phase does.
func TestWaitAfter(t *testing.T) {
	v := newView(t, natstest.Start(t).JS)
	id := newID(t)
	apply(t, v,
		env(t, id, 1, events.PhaseProvisioning, &events.Created{Name: "w", Generation: 1}),
		env(t, id, 2, events.PhaseReady, &events.SupervisorAttached{Generation: 1}),
		env(t, id, 3, events.PhaseSuspending, &events.SuspendRequested{Generation: 1}),
		env(t, id, 4, events.PhaseSuspended, &events.Suspended{Generation: 1, RestoreRef: "r"}),
	)
	// A resume was just accepted at seq 5; its events are not projected yet.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if got, err := v.Wait(ctx, id, events.PhaseSuspended, 5); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait(suspended, after 5) = %+v, %v; the view at 4 must not answer", got, err)
	}
	ch := make(chan waited, 1)
	go func() {
		view, err := v.Wait(context.Background(), id, events.PhaseSuspended, 5)
		ch <- waited{view, err}
	}()
	apply(t, v,
		env(t, id, 5, events.PhaseStarting, &events.ResumeRequested{Generation: 2, RestoreRef: "r"}),
		env(t, id, 6, events.PhaseSuspended, &events.ResumeFailed{Generation: 2}),
	)
	if w := receive(t, ch); w.err != nil || w.view.Seq != 6 {
		t.Fatalf("Wait after 5 = %+v, %v; want the view at 6", w.view, w.err)
	}
}

// TestListOfAStreamThatHoldsBackIsUnavailable: a list whose pulls bring
// nothing while the bucket's stream says it holds more (in a cluster, the
// list's consumer led by a replica still catching up) waits a while, then
// answers UNAVAILABLE, which clients retry, rather than INTERNAL. The
// stream is made to hold back here by purging its last message: its last
// sequence stays where it was.
func TestListOfAStreamThatHoldsBackIsUnavailable(t *testing.T) {
	n := natstest.Start(t)
	v := newView(t, n.JS)
	fleet(t, v, member{nil, events.PhaseReady}, member{nil, events.PhaseReady})
	ctx := context.Background()
	stream, err := n.JS.Stream(ctx, "KV_"+v.cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(last.Subject)); err != nil {
		t.Fatal(err)
	}
	if info, err = stream.Info(ctx); err != nil || info.State.LastSeq != last.Sequence {
		t.Fatalf("the purge moved the stream's last sequence: %v, %v", info, err)
	}
	defer func(d time.Duration) { listStall = d }(listStall)
	listStall = 300 * time.Millisecond
	began := time.Now()
	_, err = v.List(ctx, Query{})
	if events.CodeOf(err) != events.CodeUnavailable {
		t.Fatalf("list of a stream holding back: %v; want UNAVAILABLE", err)
	}
	if waited := time.Since(began); waited < listStall {
		t.Errorf("the list gave up after %s, before its %s", waited, listStall)
	}
}
