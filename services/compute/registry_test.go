package compute_test

import (
	"context"
	"errors"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// bare is a driver with none of the optional capabilities, though its
// Capabilities claims to suspend.
type bare struct{}

func (bare) Capabilities(map[string]string) compute.Capabilities {
	return compute.Capabilities{Suspend: true, ResumeElsewhere: true, Retains: "everything"}
}
func (bare) Start(context.Context, compute.Start) error { return nil }
func (bare) Stop(context.Context, compute.Target) error { return nil }
func (bare) Delete(context.Context, compute.Spec) error { return nil }

// TestRegistryAnswersForMissingCapabilities: a driver without Logger, Dialer
// or Suspender answers UNIMPLEMENTED for logs and ports, and never advertises
// a suspension it cannot do; an unknown driver name is an error, not a panic.
func TestRegistryAnswersForMissingCapabilities(t *testing.T) {
	r := compute.Registry{"bare": bare{}}
	ctx := context.Background()
	spec := compute.Spec{SandboxID: "s1"}
	if _, err := r.Logs(ctx, "bare", spec, 10); !errors.Is(err, compute.ErrUnimplemented) || events.CodeOf(err) != events.CodeUnimplemented {
		t.Errorf("logs of a driver that keeps none: %v (%s), want UNIMPLEMENTED", err, events.CodeOf(err))
	}
	if _, err := r.Dial(ctx, "bare", spec, 80); !errors.Is(err, compute.ErrUnimplemented) || events.CodeOf(err) != events.CodeUnimplemented {
		t.Errorf("dial through a driver with no ports: %v (%s), want UNIMPLEMENTED", err, events.CodeOf(err))
	}
	c, err := r.Capabilities("bare", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c != (compute.Capabilities{}) {
		t.Errorf("capabilities of a driver that is no Suspender: %+v, want none", c)
	}
	for _, f := range []func() error{
		func() error { _, err := r.Driver("nope"); return err },
		func() error { _, err := r.Logs(ctx, "nope", spec, 1); return err },
		func() error { _, err := r.Dial(ctx, "nope", spec, 1); return err },
		func() error { return r.Validate("nope", compute.Spec{}) },
	} {
		if err := f(); err == nil {
			t.Errorf("an unknown driver was taken")
		}
	}
}
