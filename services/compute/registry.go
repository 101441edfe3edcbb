package compute

import (
	"fmt"
	"sort"
)

// Registry maps driver names ("sim", …) to drivers.
type Registry map[string]Driver

// Driver returns the driver called name, or an error naming the known ones.
func (r Registry) Driver(name string) (Driver, error) {
	d, ok := r[name]
	if !ok {
		names := make([]string, 0, len(r))
		for n := range r {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("unknown driver %q (known: %v)", name, names)
	}
	return d, nil
}

// Capabilities reports what driver name can do for a sandbox with opts.
func (r Registry) Capabilities(name string, opts map[string]string) (Capabilities, error) {
	d, err := r.Driver(name)
	if err != nil {
		return Capabilities{}, err
	}
	return d.Capabilities(opts), nil
}

// OptionValidator is a driver that checks the options of a create.
type OptionValidator interface {
	ValidateOptions(opts map[string]string) error
}

// Validate checks that driver name exists and, if it can, that it accepts opts.
func (r Registry) Validate(name string, opts map[string]string) error {
	d, err := r.Driver(name)
	if err != nil {
		return err
	}
	if v, ok := d.(OptionValidator); ok {
		return v.ValidateOptions(opts)
	}
	return nil
}
