package sagas

import (
	"context"
	"errors"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// exportWait bounds the wait for an export ahead (issue 29): the vm
// driver's own Put is bounded by as much.
const exportWait = 5 * time.Minute

// noteExport follows a recorded suspension on ref (suspend.go): when the
// driver exports retained states ahead (compute.ExportAwaiter; the vm
// driver on a node with peers), it waits, on a goroutine of its own that
// holds no worker slot and for exportWait at most, for the export of ref
// to finish, then records sandbox.retained_state_exported{ref, via,
// bytes}, caused by the suspension's intent: the view then says the
// state is movable, with its size. The gateway judges the note at the
// log's head: a sandbox no longer suspended on ref (resumed, its state
// discarded, deleted, suspended again on another) refuses it, and nothing
// is appended. The note lives in memory only: a runner that stops or
// crashes meanwhile loses it, and nothing records it later (the export
// itself is the driver's, and a resume on another node exports, or finds
// the export made, all the same).
func (r *Runner) noteExport(ctx context.Context, s *step, ref string) {
	aw, ok := s.driver.(compute.ExportAwaiter)
	if !ok || ref == "" {
		return
	}
	// A step of its own, holding no slot: the saga's step has ended.
	n := &step{saga: s.saga, intent: s.intent, created: s.created, spec: s.spec, driver: s.driver, log: s.log}
	r.late.Go(func() {
		wctx, cancel := context.WithTimeout(ctx, exportWait)
		defer cancel()
		via, bytes, err := aw.AwaitExport(wctx, n.spec, ref)
		switch {
		case errors.Is(err, compute.ErrUnimplemented):
			return // this node's driver exports nothing ahead
		case err != nil:
			n.log.Info().Err(err).Str("restore_ref", ref).Msg("export ahead not awaited; nothing noted")
			return
		case via == "":
			return // none ran, or it was stopped: the state is consumed or discarded
		}
		err = r.record(ctx, n, &events.RetainedStateExported{RestoreRef: ref, Via: via, Bytes: bytes})
		if err != nil {
			n.log.Info().Err(err).Str("restore_ref", ref).Msg("export ahead not noted: the sandbox moved on")
		}
	})
}
