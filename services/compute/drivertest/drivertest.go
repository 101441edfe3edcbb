// Package drivertest is the contract suite of compute.Driver: every driver
// (sim, process, vm, a driver over the bus) runs Run, and so behaves the same
// for starts and stops, suspensions and restores, repeats of any call,
// sandboxes it never saw, references it must refuse, and what it observes
// after each.
package drivertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Timeout bounds every wait of the suite.
const Timeout = 20 * time.Second

// Harness is a driver under test and what the suite needs around it.
type Harness struct {
	Driver compute.Driver
	// Reports receives the reports of the driver's supervisors (the
	// harness answers them as the gateway would).
	Reports <-chan compute.Report
	// Spec is the spec of a new sandbox id: options and a command that runs
	// until it is stopped.
	Spec func(id string) compute.Spec
	// Timeout bounds the suite's waits; 0 is Timeout (a VM's boot under
	// emulation on a busy machine needs more).
	Timeout time.Duration
}

// Run runs the suite; newHarness returns a fresh driver per subtest and
// cleans it up with t.Cleanup.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	tests := []struct {
		name    string
		suspend bool // needs a Suspender
		run     func(t *testing.T, s *suite)
	}{
		{"start runs the generation, its supervisor attaches with its credential", false, testStart},
		{"a repeated start is no second effect", false, testStartRepeated},
		{"stop, a repeated stop, and a start of the next generation", false, testStopStart},
		{"a sandbox the driver never saw", false, testUnknownSandbox},
		{"delete leaves nothing, and again", false, testDelete},
		{"suspend freezes the generation behind a reference, a repeat gives the same", true, testSuspend},
		{"resume restores under the next generation, a repeat answers the same", true, testResume},
		{"a consumed reference is refused to another generation", true, testConsumedRefused},
		{"a superseded reference is refused", true, testSuperseded},
		{"a discarded reference is refused", true, testDiscarded},
		{"delete invalidates the references", true, testDeleteInvalidates},
		{"suspending one sandbox leaves another running", true, testIsolation},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			s := &suite{t: t, h: h}
			if tc.suspend {
				var ok bool
				if s.sus, ok = h.Driver.(compute.Suspender); !ok || !compute.CapabilitiesOf(h.Driver, h.Spec(uuid.NewString()).Options).Suspend {
					t.Skip("the driver cannot suspend")
				}
			}
			tc.run(t, s)
		})
	}
}

// suite is one subtest's driver and its helpers.
type suite struct {
	t   *testing.T
	h   Harness
	sus compute.Suspender
}

// wait is how long the suite waits for anything.
func (s *suite) wait() time.Duration {
	if s.h.Timeout > 0 {
		return s.h.Timeout
	}
	return Timeout
}

func (s *suite) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.wait())
	s.t.Cleanup(cancel)
	return ctx
}

// sandbox is a new sandbox's spec.
func (s *suite) sandbox() compute.Spec { return s.h.Spec(uuid.Must(uuid.NewV7()).String()) }

// Cred is the credential the suite (and its Gateway) mints for generation gen.
func Cred(gen int64) string { return fmt.Sprintf("credential-of-%d", gen) }

func cred(gen int64) string { return Cred(gen) }

// attached waits for the attach of generation gen of spec's sandbox, with
// its credential; other reports are passed over.
func (s *suite) attached(spec compute.Spec, gen int64) {
	s.t.Helper()
	timeout := time.After(s.wait())
	for {
		select {
		case r := <-s.h.Reports:
			if r.SandboxID == spec.SandboxID && r.Kind == compute.ReportAttached && r.Generation == gen {
				if r.Credential != cred(gen) {
					s.t.Fatalf("attach of generation %d with credential %q, want %q", gen, r.Credential, cred(gen))
				}
				return
			}
		case <-timeout:
			s.t.Fatalf("no attach of generation %d of %s in %s", gen, spec.SandboxID, s.wait())
		}
	}
}

// start starts gen and waits for its attach.
func (s *suite) start(spec compute.Spec, gen int64) {
	s.t.Helper()
	s.t.Cleanup(func() { _ = s.h.Driver.Delete(context.Background(), spec) })
	if err := s.h.Driver.Start(s.ctx(), compute.Start{Spec: spec, Generation: gen, Credential: cred(gen)}); err != nil {
		s.t.Fatalf("start generation %d: %v", gen, err)
	}
	s.attached(spec, gen)
}

// observe checks what the driver observes of spec's sandbox, when it can.
func (s *suite) observe(spec compute.Spec, state compute.State, gen int64) compute.Observation {
	s.t.Helper()
	ob, ok := s.h.Driver.(compute.Observer)
	if !ok {
		return compute.Observation{}
	}
	o, err := ob.Observe(s.ctx(), spec)
	if err != nil {
		s.t.Fatalf("observe: %v", err)
	}
	if o.State != state || (gen != 0 && o.Generation != gen) {
		s.t.Fatalf("observed %+v, want %s at generation %d", o, state, gen)
	}
	return o
}

// suspend suspends gen and returns its reference.
func (s *suite) suspend(spec compute.Spec, gen int64) string {
	s.t.Helper()
	ref, err := s.sus.Suspend(s.ctx(), compute.Target{Spec: spec, Generation: gen})
	if err != nil || ref == "" {
		s.t.Fatalf("suspend generation %d: %q, %v", gen, ref, err)
	}
	return ref
}

// resume restores ref under gen and waits for its attach.
func (s *suite) resume(spec compute.Spec, gen int64, ref string) {
	s.t.Helper()
	res, err := s.sus.Resume(s.ctx(), compute.Resume{Spec: spec, Generation: gen, Credential: cred(gen), RestoreRef: ref})
	if err != nil || !res.Consumed {
		s.t.Fatalf("resume generation %d from %s: %+v, %v", gen, ref, res, err)
	}
	s.attached(spec, gen)
}

// refused checks a resume of ref under gen is refused with ErrUnknownRef,
// FAILED_PRECONDITION, nothing consumed.
func (s *suite) refused(spec compute.Spec, gen int64, ref string) {
	s.t.Helper()
	res, err := s.sus.Resume(s.ctx(), compute.Resume{Spec: spec, Generation: gen, Credential: cred(gen), RestoreRef: ref})
	if !errors.Is(err, compute.ErrUnknownRef) || events.CodeOf(err) != events.CodeFailedPrecondition || res.Consumed {
		s.t.Fatalf("resume generation %d from %s: %+v, %v (%s); want ErrUnknownRef, FAILED_PRECONDITION, nothing consumed",
			gen, ref, res, err, events.CodeOf(err))
	}
}

func testStart(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.observe(spec, compute.StateGone, 0)
	s.start(spec, 1)
	s.observe(spec, compute.StateRunning, 1)
}

func testStartRepeated(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	for i := 0; i < 2; i++ {
		if err := s.h.Driver.Start(s.ctx(), compute.Start{Spec: spec, Generation: 1, Credential: cred(1)}); err != nil {
			t.Fatalf("repeated start: %v", err)
		}
	}
	s.observe(spec, compute.StateRunning, 1)
	// An older generation than the newest starts nothing.
	if err := s.h.Driver.Start(s.ctx(), compute.Start{Spec: spec, Generation: 0, Credential: cred(0)}); err != nil {
		t.Fatalf("start of an older generation: %v", err)
	}
	s.observe(spec, compute.StateRunning, 1)
}

func testStopStart(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	for i := 0; i < 2; i++ {
		if err := s.h.Driver.Stop(s.ctx(), compute.Target{Spec: spec, Generation: 1}); err != nil {
			t.Fatalf("stop %d: %v", i+1, err)
		}
		s.observe(spec, compute.StateStopped, 1)
	}
	s.start(spec, 2)
	s.observe(spec, compute.StateRunning, 2)
	// A stop of the old generation leaves the new one running.
	if err := s.h.Driver.Stop(s.ctx(), compute.Target{Spec: spec, Generation: 1}); err != nil {
		t.Fatalf("stop of the old generation: %v", err)
	}
	s.observe(spec, compute.StateRunning, 2)
}

func testUnknownSandbox(t *testing.T, s *suite) {
	spec := s.sandbox()
	if err := s.h.Driver.Stop(s.ctx(), compute.Target{Spec: spec, Generation: 1}); err != nil {
		t.Fatalf("stop of a sandbox never started: %v", err)
	}
	if err := s.h.Driver.Delete(s.ctx(), spec); err != nil {
		t.Fatalf("delete of a sandbox never started: %v", err)
	}
	s.observe(spec, compute.StateGone, 0)
	sus, ok := s.h.Driver.(compute.Suspender)
	if !ok {
		return
	}
	if _, err := sus.Suspend(s.ctx(), compute.Target{Spec: spec, Generation: 1}); err == nil || events.CodeOf(err) != events.CodeFailedPrecondition {
		t.Fatalf("suspend of a sandbox never started: %v (%s), want FAILED_PRECONDITION", err, events.CodeOf(err))
	}
	res, err := sus.Resume(s.ctx(), compute.Resume{Spec: spec, Generation: 2, Credential: cred(2), RestoreRef: "never-made"})
	if !errors.Is(err, compute.ErrUnknownRef) || res.Consumed {
		t.Fatalf("resume of a reference never made: %+v, %v", res, err)
	}
}

func testDelete(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	for i := 0; i < 2; i++ {
		if err := s.h.Driver.Delete(s.ctx(), spec); err != nil {
			t.Fatalf("delete %d: %v", i+1, err)
		}
		s.observe(spec, compute.StateGone, 0)
	}
}

func testSuspend(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	ref := s.suspend(spec, 1)
	if o := s.observe(spec, compute.StateFrozen, 1); o.State != "" && o.RestoreRef != ref {
		t.Fatalf("observed frozen behind %q, the suspension answered %q", o.RestoreRef, ref)
	}
	if again := s.suspend(spec, 1); again != ref {
		t.Fatalf("repeated suspend: %q, want %q", again, ref)
	}
	s.observe(spec, compute.StateFrozen, 1)
}

func testResume(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	ref := s.suspend(spec, 1)
	s.resume(spec, 2, ref)
	// Observe names the consumption: what a resume deadline reads when
	// the resume's answer was lost (issue 24, hole 2).
	if _, ok := s.h.Driver.(compute.Observer); ok {
		if o := s.observe(spec, compute.StateRunning, 2); o.Consumed != ref || o.ConsumedGeneration != 2 {
			t.Fatalf("observed %+v after the resume, want %s consumed by generation 2", o, ref)
		}
	}
	// A repeat by the same generation answers as the first did.
	res, err := s.sus.Resume(s.ctx(), compute.Resume{Spec: spec, Generation: 2, Credential: cred(2), RestoreRef: ref})
	if err != nil || !res.Consumed {
		t.Fatalf("repeated resume: %+v, %v", res, err)
	}
	s.observe(spec, compute.StateRunning, 2)
}

func testConsumedRefused(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	ref := s.suspend(spec, 1)
	s.resume(spec, 2, ref)
	s.refused(spec, 3, ref)
	s.observe(spec, compute.StateRunning, 2)
}

func testSuperseded(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	first := s.suspend(spec, 1)
	s.resume(spec, 2, first)
	second := s.suspend(spec, 2)
	if second == first {
		t.Fatalf("a second suspension reused the reference %s", first)
	}
	s.refused(spec, 3, first)
	s.observe(spec, compute.StateFrozen, 2)
	s.resume(spec, 3, second)
}

func testDiscarded(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	ref := s.suspend(spec, 1)
	for i := 0; i < 2; i++ {
		if err := s.sus.Discard(s.ctx(), spec, ref); err != nil {
			t.Fatalf("discard %d: %v", i+1, err)
		}
	}
	if ob, ok := s.h.Driver.(compute.Observer); ok {
		if o, err := ob.Observe(s.ctx(), spec); err != nil || o.State == compute.StateFrozen || o.State == compute.StateRunning {
			t.Fatalf("observed %+v, %v after the discard; want nothing retained, nothing running", o, err)
		}
	}
	s.refused(spec, 2, ref)
}

func testDeleteInvalidates(t *testing.T, s *suite) {
	spec := s.sandbox()
	s.start(spec, 1)
	ref := s.suspend(spec, 1)
	if err := s.h.Driver.Delete(s.ctx(), spec); err != nil {
		t.Fatal(err)
	}
	s.observe(spec, compute.StateGone, 0)
	s.refused(spec, 2, ref)
}

func testIsolation(t *testing.T, s *suite) {
	a, b := s.sandbox(), s.sandbox()
	s.start(a, 1)
	s.start(b, 1)
	ref := s.suspend(a, 1)
	s.observe(b, compute.StateRunning, 1)
	s.resume(a, 2, ref)
	s.observe(a, compute.StateRunning, 2)
	s.observe(b, compute.StateRunning, 1)
}
