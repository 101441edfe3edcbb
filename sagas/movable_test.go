package sagas_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/sim"
	"github.com/torpor/torpor/services/gateway"
)

// ahead is the sim as a driver that exports ahead (compute.ExportAwaiter):
// the export of a reference finishes when the test releases it, as
// "obj:"+ref, 4096 bytes.
type ahead struct {
	full
	release chan struct{}
	once    sync.Once
	asked   chan string // the references awaited
}

func (a *ahead) AwaitExport(ctx context.Context, spec compute.Spec, ref string) (string, int64, error) {
	a.asked <- ref
	select {
	case <-a.release:
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
	return "obj:" + ref, 4096, nil
}

func (a *ahead) finish() { a.once.Do(func() { close(a.release) }) }

func newAheadStack(t *testing.T) (*stack, *ahead) {
	t.Helper()
	a := &ahead{release: make(chan struct{}), asked: make(chan string, 4)}
	s := newStackWith(t, 5*time.Second, func(d *sim.Driver) compute.Driver {
		a.full = d
		return a
	})
	t.Cleanup(a.finish) // before the runner stops
	return s, a
}

// TestExportAheadNoted (issue 29): once the driver's export ahead of a
// suspension finished, the sagas record it, and the view says the state
// is movable, with its size.
func TestExportAheadNoted(t *testing.T) {
	s, a := newAheadStack(t)
	v := s.suspended(nil)
	select {
	case ref := <-a.asked:
		if got := s.heldRef(v.ID); ref != got {
			t.Fatalf("the export of %q was awaited; the suspension holds %q", ref, got)
		}
	case <-time.After(wait):
		t.Fatal("the export ahead was never awaited")
	}
	if v.Restore.Movable {
		t.Fatalf("movable before the export finished: %+v", v.Restore)
	}
	a.finish()
	got := s.awaitTried(events.TypeRetainedStateExported)
	if !got.Restore.Movable || got.Restore.MovableBytes != 4096 || got.Phase != events.PhaseSuspended {
		t.Fatalf("after the export: %s, restore %+v; want suspended, movable, 4096 bytes", got.Phase, got.Restore)
	}
}

// TestExportAheadOvertaken (issue 29): an export that finishes after the
// suspension ended (the sandbox resumed, or deleted) is noted nowhere:
// judged at the log's head, the note is refused and nothing is appended.
func TestExportAheadOvertaken(t *testing.T) {
	for _, c := range []struct {
		verb  string
		phase events.Phase
	}{
		{gateway.VerbResume, events.PhaseReady},
		{gateway.VerbDelete, events.PhaseDeleted},
	} {
		t.Run(c.verb, func(t *testing.T) {
			s, a := newAheadStack(t)
			v := s.suspended(nil)
			select {
			case <-a.asked:
			case <-time.After(wait):
				t.Fatal("the export ahead was never awaited")
			}
			acc, err := s.do(gateway.Command{Verb: c.verb, ID: v.ID})
			if err != nil {
				t.Fatal(err)
			}
			if got := s.await(v.ID, acc.Seq, events.PhaseStarting, events.PhaseDeleting); got.Phase != c.phase {
				t.Fatalf("after the %s: %s, want %s", c.verb, got.Phase, c.phase)
			}
			a.finish()
			got := s.awaitTried(events.TypeRetainedStateExported)
			if got.Phase != c.phase || got.Restore.Movable {
				t.Fatalf("after the export: %s, restore %+v; want %s, not movable", got.Phase, got.Restore, c.phase)
			}
			envs, err := s.store.Load(context.Background(), v.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, env := range envs {
				if env.Type == events.TypeRetainedStateExported {
					t.Fatalf("the log holds %s at seq %d after the %s", env.Type, env.Seq, c.verb)
				}
			}
		})
	}
}

// heldRef is the reference of sandbox id's newest suspension in the log.
func (s *stack) heldRef(id string) string {
	s.t.Helper()
	envs, err := s.store.Load(context.Background(), id, 0)
	if err != nil {
		s.t.Fatal(err)
	}
	ref := ""
	for _, env := range envs {
		if e, err := env.Decode(); err == nil {
			if su, ok := e.(*events.Suspended); ok {
				ref = su.RestoreRef
			}
		}
	}
	return ref
}

// awaitTried waits until the sagas asked to record an event of type typ
// and the gateway answered, and returns sandbox views as the log holds
// them then (the only sandbox of the stack).
func (s *stack) awaitTried(typ string) events.View {
	s.t.Helper()
	timeout := time.After(wait)
	for {
		s.mu.Lock()
		ch, n := s.changed, s.tried[typ]
		s.mu.Unlock()
		if n > 0 {
			return s.only()
		}
		select {
		case <-ch:
		case <-timeout:
			s.t.Fatalf("the sagas never recorded %s", typ)
		}
	}
}

// only is the view of the one sandbox the stack's log holds.
func (s *stack) only() events.View {
	s.t.Helper()
	var v events.View
	if _, err := s.store.Replay(context.Background(), 0, func(envs []events.Envelope) error {
		for _, env := range envs {
			v.Fold(env)
		}
		return nil
	}); err != nil {
		s.t.Fatal(err)
	}
	return v
}
