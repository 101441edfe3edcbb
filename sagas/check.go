package sagas

import (
	"context"
	"errors"
	"fmt"

	"github.com/torpor/torpor/services/compute"
)

// A resume asks its target first (issue 29): before anything is consumed,
// a driver that is a compute.Checker says whether the node the resume runs
// on can restore the state (a vm's QEMU version and machine type, memory,
// disk). A refusal is the resume's failure, recorded as
// sandbox.resume_failed{node, reason CannotRestore, message}: the state is
// still held, the sandbox suspended again. The runner keeps the refusal of
// an intent until it is recorded, so that a step that comes again (its
// record failed) records it without asking the node again: one resume asks
// a node once for a given answer, and never loops on a refusing target.

// refusal is a target's answer that it cannot restore a resume's state.
type refusal struct {
	node string
	err  error
}

func (f *refusal) Error() string {
	return fmt.Sprintf("node %s cannot restore the retained state: %v", f.node, f.err)
}

func (f *refusal) Unwrap() error { return f.err }

// checkTarget asks s's driver, if it is a compute.Checker, whether spec's
// node can restore ref. It returns a *refusal when the node refused (once
// per intent: a refusal kept from an earlier try is returned as it is), an
// error the caller calls again on when it got no answer, and nil when the
// node can, cannot tell, or was not asked.
func (r *Runner) checkTarget(ctx context.Context, s *step, spec compute.Spec, ref string) error {
	ch, ok := s.driver.(compute.Checker)
	if !ok {
		return nil
	}
	r.mu.Lock()
	f := r.refusals[s.intent.ID]
	r.mu.Unlock()
	if f != nil && f.node == spec.Node {
		return f
	}
	err := r.timed(s, "check", func() error { return ch.CanRestore(ctx, spec, ref) })
	switch {
	case err == nil:
		return nil
	case errors.Is(err, compute.ErrRejected):
		f = &refusal{node: spec.Node, err: err}
		r.mu.Lock()
		r.refusals[s.intent.ID] = f
		r.mu.Unlock()
		return f
	case unanswered(err) || ctx.Err() != nil:
		return err
	}
	s.log.Warn().Err(err).Str("step", "check").Msg("the target could not say whether it can restore; the resume will")
	return nil
}

// forgetRefusal forgets the refusal of s's intent, recorded (or dropped).
func (r *Runner) forgetRefusal(s *step) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.refusals, s.intent.ID)
}
