package remote_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/remote"
)

// restorer is the fake with a Checker: it answers answer and notes each
// question ("sandbox node ref").
type restorer struct {
	fake
	answer error

	mu   sync.Mutex
	asks []string
}

func (r *restorer) CanRestore(ctx context.Context, spec compute.Spec, ref string) error {
	r.mu.Lock()
	r.asks = append(r.asks, spec.SandboxID+" "+spec.Node+" "+ref)
	r.mu.Unlock()
	return r.answer
}

// TestRemoteCheck (issue 29): a target on the bus answers whether it can
// restore a reference: a refusal comes back as the driver said it
// (ErrRejected, FAILED_PRECONDITION, its reason), an acceptance as nil; a
// driver that is no Checker answers UNIMPLEMENTED, which Routed takes as
// not asked.
func TestRemoteCheck(t *testing.T) {
	srv := natstest.Start(t)
	no := &restorer{answer: fmt.Errorf("%w: the snapshot's machine type pc-q35-9.2 is not in QEMU 7.2.22 here", compute.ErrRejected)}
	yes := &restorer{}
	serve(t, srv.Connect(t), "n1", compute.Registry{"no": no, "yes": yes, "fake": &fake{}})
	s := spec("sb1", nil)

	err := remote.NewClient(srv.Conn, "n1", "no").CanRestore(ctx(t), s, "vmobj:sb1/snap:abc")
	if !errors.Is(err, compute.ErrRejected) || events.CodeOf(err) != events.CodeFailedPrecondition || !strings.Contains(err.Error(), "pc-q35-9.2") {
		t.Errorf("a refusing target: %v (%s), want ErrRejected, FAILED_PRECONDITION, with its reason", err, events.CodeOf(err))
	}
	if got, want := strings.Join(no.asks, ","), "sb1 n1 vmobj:sb1/snap:abc"; got != want {
		t.Errorf("the target was asked %q, want %q", got, want)
	}
	if err := remote.NewClient(srv.Conn, "n1", "yes").CanRestore(ctx(t), s, "r"); err != nil || len(yes.asks) != 1 {
		t.Errorf("an accepting target: %v after %d questions, want nil after one", err, len(yes.asks))
	}
	err = remote.NewClient(srv.Conn, "n1", "fake").CanRestore(ctx(t), s, "r")
	if !errors.Is(err, compute.ErrUnimplemented) || events.CodeOf(err) != events.CodeUnimplemented {
		t.Errorf("a driver that is no Checker: %v (%s), want UNIMPLEMENTED", err, events.CodeOf(err))
	}
	routed := &compute.Routed{Local: "n0", Here: &fake{}, There: func(n string) compute.Driver { return remote.NewClient(srv.Conn, n, "fake") }}
	if err := routed.CanRestore(ctx(t), s, "r"); err != nil {
		t.Errorf("routed to a driver that is no Checker: %v, want nil (not asked)", err)
	}
	routed = &compute.Routed{Local: "n0", Here: &fake{}, There: func(n string) compute.Driver { return remote.NewClient(srv.Conn, n, "no") }}
	if err := routed.CanRestore(ctx(t), s, "r"); !errors.Is(err, compute.ErrRejected) {
		t.Errorf("routed to a refusing target: %v, want its refusal", err)
	}
}
