package node

import (
	"context"

	"github.com/torpor/torpor/services/forward"
	"github.com/torpor/torpor/services/gateway"
)

// The forwards wake the sandboxes that wake on traffic through the
// service: a resume like any client's, its actor the forward.
var _ forward.Waker = sandboxes{}

func (s sandboxes) State(ctx context.Context, id string) (forward.State, error) {
	sb, err := s.svc.Sandbox(ctx, id)
	if err != nil {
		return forward.State{}, err
	}
	return forward.State{Phase: sb.Phase, Generation: sb.View.Generation, WakeOnTraffic: sb.View.WakeOnTraffic,
		LastOutcome: sb.View.LastOutcome, Reason: sb.View.Reason}, nil
}

func (s sandboxes) Resume(ctx context.Context, id, fid string, gen int64) error {
	_, err := s.svc.Handle(ctx, gateway.Command{Verb: gateway.VerbResume, ID: id, Actor: "forward:" + fid,
		IdempotencyKey: forward.WakeKey(gen)})
	return err
}
