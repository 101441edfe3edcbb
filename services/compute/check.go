package compute

import (
	"context"
	"errors"
)

// Checker is a Suspender that can say, before anything is consumed,
// whether it can restore a retained state on the node spec names: the
// resume saga asks the target first (issue 29), and records a refusal as
// the resume's failure with its reason, the state still held. A driver
// that is no Checker is not asked.
type Checker interface {
	// CanRestore answers nil when the node can restore the state behind
	// ref (or cannot tell: the resume then says), else an error wrapping
	// ErrRejected (FAILED_PRECONDITION) whose message says why: the
	// snapshot's machine type missing from the node's QEMU, too little
	// free memory or disk, say. It changes nothing. A reference the node
	// consumed already (a resume whose answer was lost) is nil: the
	// resume, asked again, answers as it did.
	CanRestore(ctx context.Context, spec Spec, ref string) error
}

var _ Checker = (*Routed)(nil)

// CanRestore asks the driver of spec's node, if it is a Checker; a node
// whose driver does not know the question (an older one, UNIMPLEMENTED) is
// not asked either.
func (r *Routed) CanRestore(ctx context.Context, spec Spec, ref string) error {
	c, ok := r.to(spec.Node).(Checker)
	if !ok {
		return nil
	}
	if err := c.CanRestore(ctx, spec, ref); err != nil && !errors.Is(err, ErrUnimplemented) {
		return err
	}
	return nil
}
