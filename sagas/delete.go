package sagas

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Delete saga:
//   sandbox.delete_requested → driver.Delete(spec)   (a missing resource counts as deleted)
//     then driver.Delete on each node the sandbox moved away from (resume --node), once each, an error only logged
//     ok, a retained state held → record sandbox.retained_state_invalidated{ref} + sandbox.deleted
//     ok                        → record sandbox.deleted
//     other error               → not recorded; the intent comes again
//     deadline                  → nothing here: the phase's deadline settles it (deadline.go: deleted if the driver holds
//                                 nothing of it any more, else error)

func (r *Runner) delete(ctx context.Context, s *step) error {
	all, err := r.src.Load(ctx, s.spec.SandboxID, 0)
	if err != nil {
		return fmt.Errorf("load %s: %w", s.spec.SandboxID, err)
	}
	held := heldRef(all)
	err = r.within(ctx, s, "delete", unanswered, func(ctx context.Context) error { return s.driver.Delete(ctx, s.spec) })
	switch {
	case err == nil, errors.Is(err, compute.ErrResourceMissing):
	case errors.Is(err, errStopping):
		return err
	case errors.Is(err, errDeadline):
		s.log.Warn().Err(err).Str("step", "delete").Msg("deadline passed; the phase's deadline settles it")
		return nil
	default:
		s.log.Warn().Err(err).Str("step", "delete").Msg("delete failed; the intent comes again")
		return err
	}
	// The nodes it moved away from may still hold a copy a resume could
	// not discard there (leave): each is told once, and one that does not
	// answer holds up nothing (it is logged).
	for _, n := range formerNodes(all, s.spec.Node) {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		spec := s.spec
		spec.Node = n
		if err := r.timed(s, "delete", func() error { return s.driver.Delete(dctx, spec) }); err != nil {
			s.log.Warn().Err(err).Str("step", "delete").Str("node", n).Msg("a node the sandbox moved away from is not told of its delete")
		}
		cancel()
	}
	evs := []events.Event{&events.Deleted{}}
	if held != "" {
		evs = []events.Event{&events.RetainedStateInvalidated{RestoreRef: held}, &events.Deleted{}}
	}
	err = r.recordOrDrop(ctx, s, evs...)
	if err == nil {
		r.specs.forget(s.spec.SandboxID)
	}
	return err
}

// formerNodes are the nodes log's sandbox was on before the one it is on,
// now: where it was created and where each consumption moved it.
func formerNodes(log []events.Envelope, now string) []string {
	var out []string
	add := func(n string) {
		if n != "" && n != now && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	for _, env := range log {
		switch env.Type {
		case events.TypeCreated, events.TypeRetainedStateConsumed:
		default:
			continue
		}
		switch e, _ := env.Decode(); e := e.(type) {
		case *events.Created:
			add(e.Node)
		case *events.RetainedStateConsumed:
			add(e.Node)
		}
	}
	return out
}

// heldRef returns the restore reference of the last sandbox.suspended that
// was not consumed, discarded or invalidated since, or "".
func heldRef(log []events.Envelope) string {
	held := ""
	for _, env := range log {
		e, err := env.Decode()
		if err != nil {
			continue
		}
		switch e := e.(type) {
		case *events.Suspended:
			held = e.RestoreRef
		case *events.RetainedStateConsumed:
			if e.RestoreRef == held {
				held = ""
			}
		case *events.RetainedStateDiscarded:
			if e.RestoreRef == held {
				held = ""
			}
		case *events.RetainedStateInvalidated:
			if e.RestoreRef == held {
				held = ""
			}
		}
	}
	return held
}
