package compute

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
)

// Registry maps driver names ("sim", …) to drivers.
type Registry map[string]Driver

// Driver returns the driver called name, or an error naming the known ones.
func (r Registry) Driver(name string) (Driver, error) {
	d, ok := r[name]
	if !ok {
		return nil, fmt.Errorf("unknown driver %q (known: %s)", name, strings.Join(r.Names(), ", "))
	}
	return d, nil
}

// Capabilities reports what driver name can do for a sandbox with opts: a
// driver that is no Suspender cannot suspend, whatever it says.
func (r Registry) Capabilities(name string, opts map[string]string) (Capabilities, error) {
	d, err := r.Driver(name)
	if err != nil {
		return Capabilities{}, err
	}
	return CapabilitiesOf(d, opts), nil
}

// CapabilitiesOf is what d can do for a sandbox with opts.
func CapabilitiesOf(d Driver, opts map[string]string) Capabilities {
	c := d.Capabilities(opts)
	if _, ok := d.(Suspender); !ok {
		c.Suspend, c.ResumeElsewhere, c.Retains, c.RetainedSize = false, false, "", false
	}
	return c
}

// Names lists the drivers' names, sorted.
func (r Registry) Names() []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// SpecValidator is a driver that checks a create before it is accepted: its
// options, command and environment (spec's SandboxID and Node are not yet
// known). What only the node can tell (is the command on its PATH?) is the
// start's to refuse.
type SpecValidator interface {
	ValidateSpec(spec Spec) error
}

// Validate checks that driver name exists and, if it can, that it accepts
// spec.
func (r Registry) Validate(name string, spec Spec) error {
	d, err := r.Driver(name)
	if err != nil {
		return err
	}
	if v, ok := d.(SpecValidator); ok {
		return v.ValidateSpec(spec)
	}
	return nil
}

// Logs is the last tail lines of the output of spec's workload under driver
// name, or an error wrapping ErrUnimplemented when the driver keeps none.
func (r Registry) Logs(ctx context.Context, name string, spec Spec, tail int) ([]byte, error) {
	l, err := optional[Logger](r, name, "keeps no output")
	if err != nil {
		return nil, err
	}
	return l.Logs(ctx, spec, tail)
}

// Dial connects to port of spec's workload under driver name, or answers an
// error wrapping ErrUnimplemented when the driver's workloads have no ports
// torpor can reach.
func (r Registry) Dial(ctx context.Context, name string, spec Spec, port int) (net.Conn, error) {
	dl, err := optional[Dialer](r, name, "has no ports to forward to")
	if err != nil {
		return nil, err
	}
	return dl.Dial(ctx, spec, port)
}

// optional is driver name as the optional interface T, or an error wrapping
// ErrUnimplemented that says the driver lacks what T does.
func optional[T any](r Registry, name, lacks string) (T, error) {
	var none T
	d, err := r.Driver(name)
	if err != nil {
		return none, err
	}
	t, ok := d.(T)
	if !ok {
		return none, fmt.Errorf("driver %s %s: %w", name, lacks, ErrUnimplemented)
	}
	return t, nil
}
