package compute

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Routed is one driver of a service that drives several nodes: each call
// goes to the driver of the node its spec names, Here for the service's own
// node (Local), There(node) for another (a driver on the bus). Every call
// carries its spec, so the route needs no state of its own; a sandbox that
// moved (its state consumed on another node) is routed by the node its
// spec names then.
type Routed struct {
	Local string
	Here  Driver
	There func(node string) Driver

	mu      sync.Mutex
	remotes map[string]Driver
}

var (
	_ Driver        = (*Routed)(nil)
	_ Suspender     = (*Routed)(nil)
	_ Exporter      = (*Routed)(nil)
	_ Observer      = (*Routed)(nil)
	_ Logger        = (*Routed)(nil)
	_ Dialer        = (*Routed)(nil)
	_ SpecValidator = (*Routed)(nil)
	_ ExportAwaiter = (*Routed)(nil)
)

// to is the driver of node (the service's own when empty).
func (r *Routed) to(node string) Driver {
	if node == "" || node == r.Local {
		return r.Here
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.remotes[node]
	if !ok {
		d = r.There(node)
		if r.remotes == nil {
			r.remotes = map[string]Driver{}
		}
		r.remotes[node] = d
	}
	return d
}

// as is node's driver as the optional interface T, or an error wrapping
// ErrUnimplemented.
func as[T any](r *Routed, node, lacks string) (T, error) {
	t, ok := r.to(node).(T)
	if !ok {
		var none T
		return none, fmt.Errorf("the driver of node %s %s: %w", node, lacks, ErrUnimplemented)
	}
	return t, nil
}

// Capabilities are the service's own driver's: the nodes it drives run the
// same drivers (DESIGN: same QEMU and machine shape on every node).
func (r *Routed) Capabilities(opts map[string]string) Capabilities {
	return CapabilitiesOf(r.Here, opts)
}

func (r *Routed) ValidateSpec(spec Spec) error {
	if v, ok := r.to(spec.Node).(SpecValidator); ok {
		return v.ValidateSpec(spec)
	}
	return nil
}

func (r *Routed) Start(ctx context.Context, req Start) error {
	return r.to(req.Spec.Node).Start(ctx, req)
}

func (r *Routed) Stop(ctx context.Context, t Target) error { return r.to(t.Spec.Node).Stop(ctx, t) }

func (r *Routed) Delete(ctx context.Context, spec Spec) error {
	return r.to(spec.Node).Delete(ctx, spec)
}

func (r *Routed) Suspend(ctx context.Context, t Target) (string, error) {
	s, err := as[Suspender](r, t.Spec.Node, "cannot suspend")
	if err != nil {
		return "", err
	}
	return s.Suspend(ctx, t)
}

func (r *Routed) Resume(ctx context.Context, req Resume) (ResumeResult, error) {
	s, err := as[Suspender](r, req.Spec.Node, "cannot resume")
	if err != nil {
		return ResumeResult{}, err
	}
	return s.Resume(ctx, req)
}

func (r *Routed) Discard(ctx context.Context, spec Spec, ref string) error {
	s, err := as[Suspender](r, spec.Node, "cannot discard")
	if err != nil {
		return err
	}
	return s.Discard(ctx, spec, ref)
}

func (r *Routed) Export(ctx context.Context, spec Spec, ref string) (string, error) {
	e, err := as[Exporter](r, spec.Node, "cannot move retained state")
	if err != nil {
		return "", err
	}
	return e.Export(ctx, spec, ref)
}

func (r *Routed) AwaitExport(ctx context.Context, spec Spec, ref string) (string, int64, error) {
	a, err := as[ExportAwaiter](r, spec.Node, "exports nothing ahead")
	if err != nil {
		return "", 0, err
	}
	return a.AwaitExport(ctx, spec, ref)
}

func (r *Routed) Observe(ctx context.Context, spec Spec) (Observation, error) {
	o, err := as[Observer](r, spec.Node, "cannot observe")
	if err != nil {
		return Observation{}, err
	}
	return o.Observe(ctx, spec)
}

func (r *Routed) Logs(ctx context.Context, spec Spec, tail int) ([]byte, error) {
	l, err := as[Logger](r, spec.Node, "keeps no output")
	if err != nil {
		return nil, err
	}
	return l.Logs(ctx, spec, tail)
}

func (r *Routed) Dial(ctx context.Context, spec Spec, port int) (net.Conn, error) {
	d, err := as[Dialer](r, spec.Node, "has no ports to forward to")
	if err != nil {
		return nil, err
	}
	return d.Dial(ctx, spec, port)
}
