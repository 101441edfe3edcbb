package sagas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Suspend saga:
//   sandbox.suspend_requested{generation} → driver.Suspend(generation), called again until the driver answers
//     ok               → record sandbox.suspended{restore_ref}   | compensation: driver.Discard(ref) if the record is refused (a racing exit won, or the deadline settled it)
//                        then, when the driver exports ahead (movable.go), on a goroutine of its own: driver.AwaitExport(ref)
//                          → record sandbox.retained_state_exported{restore_ref, via, bytes} if still suspended on ref, else nothing
//     rejected         → record sandbox.suspend_rejected{SuspendRejected}
//     unimplemented    → record sandbox.suspend_rejected{SuspendRejected}   (should not happen: the gateway refuses first)
//     resource missing → record sandbox.resource_lost{generation}
//     deadline         → nothing here: the phase's deadline settles it (deadline.go: ready if the workload runs, else error);
//                        the call goes on for one more deadline (a remote node may take it late), and its late answer
//                        is a job of its own on the sandbox's queue (issue 24, hole 9):
//       a reference (or, with no answer, the workload observed frozen behind one)
//                      → record sandbox.suspended{ref} if the sandbox is still suspending, else the reference is released:
//                        the sandbox back in ready on the suspended generation (the suspension cancelled)
//                          → driver.Resume(ref) in place, under that generation: the workload runs again behind ready
//                        otherwise, or if that fails → driver.Discard(ref); when the sandbox was back in ready and the
//                          workload is not observed running after it, record supervisor.detached{generation}
//                          (provisioning: its deadline ends it in error and cleans up)

func (r *Runner) suspend(ctx context.Context, s *step, in *events.SuspendRequested) error {
	s.log = s.log.With().Int64("generation", in.Generation).Logger()
	t := compute.Target{Spec: s.spec, Generation: in.Generation}
	at := s.intent.Time
	if at.IsZero() {
		at = time.Now()
	}
	var ref string
	err := r.within(ctx, s, "suspend", unrefused, func(dctx context.Context) error {
		if s.suspender == nil {
			return fmt.Errorf("driver %s: %w", s.created.Driver, compute.ErrUnimplemented)
		}
		if err := dctx.Err(); err != nil {
			return err // no suspension begins after the phase's deadline
		}
		// The call is bounded by one more deadline than the phase's: an
		// answer after the phase's is still the driver's, taken late.
		lctx, cancel := context.WithDeadline(ctx, at.Add(2*r.cfg.Deadline))
		answered := make(chan suspendAnswer, 1)
		r.late.Go(func() {
			defer cancel()
			ref, err := s.suspender.Suspend(lctx, t)
			answered <- suspendAnswer{ref: ref, err: err}
		})
		select {
		case a := <-answered:
			ref = a.ref
			return a.err
		case <-dctx.Done():
			r.late.Go(func() { r.awaitLate(ctx, s, in.Generation, answered) })
			return fmt.Errorf("suspend %s: no answer yet: %w", s.spec.SandboxID, dctx.Err())
		}
	})
	switch {
	case err == nil:
		err := r.record(ctx, s, &events.Suspended{Generation: in.Generation, RestoreRef: ref, Bytes: r.retainedBytes(ctx, s, ref)})
		if err == nil {
			r.noteExport(ctx, s, ref) // issue 29: movable.go
		}
		if !errors.Is(err, errRefused) {
			return err
		}
		if owned, err := r.logged(ctx, s.intent.SandboxID, ref); err != nil || owned {
			return err // the log holds the reference (another record of the same suspension): it is the log's
		}
		s.log.Info().Err(err).Str("step", "record").Msg("suspended refused; releasing the reference")
		return r.compensate(ctx, s, "discard", "discard", func(ctx context.Context) error { return s.suspender.Discard(ctx, s.spec, ref) })
	case errors.Is(err, errStopping):
		return err
	case errors.Is(err, errDeadline):
		s.log.Warn().Err(err).Str("step", "suspend").Msg("deadline passed; the phase's deadline settles it")
		return nil
	case errors.Is(err, compute.ErrResourceMissing):
		return r.recordOrDrop(ctx, s, &events.ResourceLost{Generation: in.Generation, Message: err.Error()})
	}
	s.log.Info().Err(err).Str("step", "suspend").Msg("suspend rejected")
	return r.recordOrDrop(ctx, s, &events.SuspendRejected{Generation: in.Generation, Reason: events.ReasonSuspendRejected, Message: err.Error()})
}

// retainedBytes is what the driver observes the retained state behind ref
// to keep, or 0 where it cannot say (it does not size what it retains, no
// answer in a moment: the size is for the view, the outcome does not wait
// on it). Drivers that do not size it cost no call.
func (r *Runner) retainedBytes(ctx context.Context, s *step, ref string) int64 {
	ob, ok := s.driver.(compute.Observer)
	if !ok || !s.driver.Capabilities(s.spec.Options).RetainedSize {
		return 0
	}
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var o compute.Observation
	err := r.timed(s, "observe", func() (err error) { o, err = ob.Observe(octx, s.spec); return err })
	if err != nil || o.RestoreRef != ref {
		return 0
	}
	return o.RetainedBytes
}

// suspendAnswer is what a driver's Suspend returned.
type suspendAnswer struct {
	ref string
	err error
}

// lateSuspend is a suspend's answer that came after the phase's deadline:
// the reference of generation gen.
type lateSuspend struct {
	gen int64
	ref string
}

// awaitLate waits for the answer of a suspend of generation gen that the
// phase's deadline cut short, and queues what it says as a job on the
// sandbox's queue: a reference, or, when the call ended with no answer, the
// reference the driver observes the workload frozen behind.
func (r *Runner) awaitLate(ctx context.Context, s *step, gen int64, answered <-chan suspendAnswer) {
	a := <-answered
	ref := a.ref
	if a.err != nil {
		if !errors.Is(a.err, context.DeadlineExceeded) && !errors.Is(a.err, compute.ErrUnavailable) &&
			events.CodeOf(a.err) != events.CodeDeadlineExceeded {
			return // the driver's answer: nothing retained
		}
		if ctx.Err() != nil {
			return
		}
		o := r.observe(ctx, s)
		if o.State != compute.StateFrozen || o.Generation != gen || o.RestoreRef == "" {
			return
		}
		ref = o.RestoreRef
	}
	if ref == "" {
		return
	}
	s.log.Warn().Str("restore_ref", ref).Msg("suspend answered after the deadline")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return
	}
	id := s.intent.SandboxID
	if r.enqueue(&job{env: s.intent, late: &lateSuspend{gen: gen, ref: ref}}) {
		r.warm.Go(func() { r.work(ctx, id) })
	}
}

// takeLate is the job of a suspend's late answer l (awaitLate): the
// suspension recorded if the sandbox is still suspending, else its
// reference released: resumed in place when the sandbox is back in ready on
// the suspended generation (the workload must run behind ready), else, or
// if that fails, discarded. An error brings it back after a backoff.
func (r *Runner) takeLate(ctx context.Context, j *job) error {
	id, l := j.env.SandboxID, j.late
	all, err := r.src.Load(ctx, id, 0)
	if err != nil {
		return fmt.Errorf("load %s: %w", id, err)
	}
	if suspendedOn(all, l.ref) {
		return nil // the log holds it: the deadline observed it frozen
	}
	st := fold(all)
	if st.created == nil || !r.drives(st.created.Node) {
		return nil
	}
	log := r.log.With().Str("sandbox_id", id).Str("saga", "suspend").Int64("generation", l.gen).
		Str("restore_ref", l.ref).Str("phase", string(st.view.Phase)).Logger()
	s := &step{saga: "suspend", intent: j.env, created: st.created, spec: compute.SpecOf(id, st.created), log: log}
	s.driver, s.drvErr = r.drv.Driver(st.created.Driver)
	if spec, err := r.creds.SpecOf(id, st.created); err == nil {
		s.spec = spec
	}
	s.suspender, _ = s.driver.(compute.Suspender)
	if s.suspender == nil {
		log.Error().Err(s.drvErr).Msg("no suspender to release a late reference")
		return nil
	}
	err = r.record(ctx, s, &events.Suspended{Generation: l.gen, RestoreRef: l.ref, Bytes: r.retainedBytes(ctx, s, l.ref)})
	if err == nil {
		r.noteExport(ctx, s, l.ref) // issue 29: movable.go
	}
	if !errors.Is(err, errRefused) {
		return err
	}
	// Refused: judged again on the log as it is now.
	if all, err = r.src.Load(ctx, id, 0); err != nil {
		return fmt.Errorf("load %s: %w", id, err)
	}
	if suspendedOn(all, l.ref) {
		return nil // recorded meanwhile (a later suspend of the same generation got the same reference)
	}
	st = fold(all)
	inPlace := st.view.Phase == events.PhaseReady && st.view.Generation == l.gen
	if inPlace {
		// The deadline cancelled the suspension and the view says ready:
		// the workload is thawed where it is, under its own generation.
		bus, err := r.busCreds(s, l.gen)
		if err == nil {
			req := compute.Resume{Spec: s.spec, Generation: l.gen, Credential: r.creds.Mint(id, l.gen), RestoreRef: l.ref, BusCreds: bus}
			err = r.compensate(ctx, s, "resume in place", "resume", func(ctx context.Context) error {
				_, err := s.suspender.Resume(ctx, req)
				return err
			})
		}
		if err == nil {
			return nil
		}
		log.Warn().Err(err).Msg("the late reference could not be resumed in place; discarding it")
	}
	if err := r.compensate(ctx, s, "discard", "discard", func(ctx context.Context) error { return s.suspender.Discard(ctx, s.spec, l.ref) }); err != nil {
		return err
	}
	if !inPlace {
		return nil
	}
	if o := r.observe(ctx, s); o.State == compute.StateRunning && o.Generation == l.gen {
		return nil
	}
	// Ready over a workload the discard ended: no supervisor is attached
	// any more (provisioning, whose deadline ends it in error and cleans
	// up, unless a supervisor attaches again).
	return r.recordOrDrop(ctx, s, &events.SupervisorDetached{Generation: l.gen})
}

// logged says whether sandbox id's log holds a suspension on ref: the
// reference is then the log's, released only by the log's own sagas.
func (r *Runner) logged(ctx context.Context, id, ref string) (bool, error) {
	all, err := r.src.Load(ctx, id, 0)
	if err != nil {
		return false, fmt.Errorf("load %s: %w", id, err)
	}
	return suspendedOn(all, ref), nil
}

// suspendedOn says whether log holds a sandbox.suspended on ref.
func suspendedOn(log []events.Envelope, ref string) bool {
	for _, env := range log {
		if env.Type != events.TypeSuspended {
			continue
		}
		if e, err := env.Decode(); err == nil && e.(*events.Suspended).RestoreRef == ref {
			return true
		}
	}
	return false
}
