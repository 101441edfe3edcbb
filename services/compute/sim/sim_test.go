package sim_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/sim"
)

const wait = 5 * time.Second

// recorder is a Reporter that hands every report to a channel.
type recorder struct{ ch chan compute.Report }

func newRecorder() *recorder { return &recorder{ch: make(chan compute.Report, 64)} }

func (r *recorder) Report(ctx context.Context, rep compute.Report) error {
	select {
	case r.ch <- rep:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next returns the next report or fails the test after a timeout.
func (r *recorder) next(t *testing.T) compute.Report {
	t.Helper()
	select {
	case rep := <-r.ch:
		return rep
	case <-time.After(wait):
		t.Fatal("no report")
		return compute.Report{}
	}
}

// none fails the test if a report is waiting. Reports are queued by the
// driver before its calls return, so callers use it after a call whose
// reports they have already drained and a later report (a sync point).
func (r *recorder) none(t *testing.T) {
	t.Helper()
	select {
	case rep := <-r.ch:
		t.Fatalf("unexpected report %+v", rep)
	default:
	}
}

func newDriver(t *testing.T) (*sim.Driver, *recorder) {
	t.Helper()
	return newDriverIn(t, "")
}

// newDriverIn is a driver with its journal in dir ("" for none).
func newDriverIn(t *testing.T, dir string) (*sim.Driver, *recorder) {
	t.Helper()
	rec := newRecorder()
	d, err := sim.New(rec, sim.Config{Data: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, rec
}

func spec(id string, opts map[string]string) compute.Spec {
	return compute.Spec{SandboxID: id, Node: "n1", Options: opts}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

func wantReport(t *testing.T, got compute.Report, kind string, gen int64) {
	t.Helper()
	if got.Kind != kind || got.Generation != gen {
		t.Fatalf("report = %+v, want kind %s generation %d", got, kind, gen)
	}
}

// startReady starts generation gen and consumes its attach report.
func startReady(t *testing.T, d *sim.Driver, rec *recorder, s compute.Spec, gen int64) {
	t.Helper()
	if err := d.Start(ctx(t), compute.Start{Spec: s, Generation: gen, Credential: "cred"}); err != nil {
		t.Fatalf("start: %v", err)
	}
	got := rec.next(t)
	wantReport(t, got, compute.ReportAttached, gen)
	if got.Credential != "cred" || got.SandboxID != s.SandboxID {
		t.Fatalf("attach = %+v", got)
	}
}

func TestStartReportsAttachIdempotently(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", nil)
	startReady(t, d, rec, s, 1)
	startReady(t, d, rec, s, 1) // a repeat re-sends the attach
	// An older generation does nothing.
	if err := d.Start(ctx(t), compute.Start{Spec: s, Generation: 0, Credential: "old"}); err != nil {
		t.Fatal(err)
	}
	startReady(t, d, rec, s, 2)
}

func TestSuspend(t *testing.T) {
	cases := []struct {
		name    string
		opts    map[string]string
		wantErr error
	}{
		{"ok by default", nil, nil},
		{"ok", map[string]string{"suspend": "ok"}, nil},
		{"reject", map[string]string{"suspend": "reject"}, compute.ErrRejected},
		{"unimplemented", map[string]string{"suspend": "unimplemented"}, compute.ErrUnimplemented},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, rec := newDriver(t)
			s := spec("sb1", c.opts)
			startReady(t, d, rec, s, 1)
			ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("suspend error = %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("suspend: %v", err)
			}
			if !strings.HasPrefix(ref, "sim:sb1:1:") {
				t.Fatalf("ref = %q, want sim:sb1:1:…", ref)
			}
			again, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
			if err != nil || again != ref {
				t.Fatalf("repeated suspend = %q, %v; want %q", again, err, ref)
			}
		})
	}
}

// TestCallsCounted: every operation is counted, refused calls included.
func TestCallsCounted(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", nil)
	startReady(t, d, rec, s, 1)
	if _, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 7}); err == nil {
		t.Fatal("suspend of a generation that never started: nil error")
	}
	if err := d.Delete(ctx(t), s); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"start": 1, "suspend": 2, "delete": 1}
	if got := d.Calls(); !maps.Equal(got, want) {
		t.Errorf("Calls = %v, want %v", got, want)
	}
}

func TestCapabilities(t *testing.T) {
	d, _ := newDriver(t)
	cases := []struct {
		opts map[string]string
		want bool
	}{
		{nil, true},
		{map[string]string{"suspend": "hang"}, true},
		{map[string]string{"suspend": "unimplemented"}, false},
		{map[string]string{"suspend": "maybe"}, false},
	}
	for _, c := range cases {
		if got := d.Capabilities(c.opts).Suspend; got != c.want {
			t.Errorf("Capabilities(%v).Suspend = %v, want %v", c.opts, got, c.want)
		}
	}
}

func TestSuspendHangBlocksUntilContextEnds(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", map[string]string{"suspend": "hang"})
	startReady(t, d, rec, s, 1)
	c, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := d.Suspend(c, compute.Target{Spec: s, Generation: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("suspend error = %v, want deadline exceeded", err)
	}
}

func TestSuspendOfAnotherGenerationIsRejected(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", nil)
	startReady(t, d, rec, s, 2)
	if _, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1}); !errors.Is(err, compute.ErrRejected) {
		t.Fatalf("suspend of generation 1 = %v, want rejected", err)
	}
	if err := d.Stop(ctx(t), compute.Target{Spec: s, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 2}); !errors.Is(err, compute.ErrRejected) {
		t.Fatalf("suspend of a stopped workload = %v, want rejected", err)
	}
}

func TestExitDuringSuspend(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", map[string]string{"exit_during_suspend": "137"})
	startReady(t, d, rec, s, 1)
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil || ref == "" {
		t.Fatalf("suspend = %q, %v; want a reference", ref, err)
	}
	// The exit was reported before Suspend answered: it is already there.
	select {
	case got := <-rec.ch:
		wantReport(t, got, compute.ReportExited, 1)
		if got.ExitCode != 137 || got.Credential != "cred" {
			t.Fatalf("exit report = %+v", got)
		}
	default:
		t.Fatal("no exit report before the suspend answered")
	}
	// A repeat returns the same reference and no second exit.
	if again, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1}); err != nil || again != ref {
		t.Fatalf("repeated suspend = %q, %v", again, err)
	}
	rec.none(t)
}

func TestResume(t *testing.T) {
	cases := []struct {
		mode string
		// attempts: for each try, whether it succeeds and whether it consumed.
		attempts []struct{ ok, consumed bool }
	}{
		{"ok", []struct{ ok, consumed bool }{{true, true}}},
		{"fail", []struct{ ok, consumed bool }{{false, false}, {false, false}}},
		{"fail_once", []struct{ ok, consumed bool }{{false, false}, {true, true}}},
		{"fail_after_consume", []struct{ ok, consumed bool }{{false, true}, {false, true}}},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			d, rec := newDriver(t)
			s := spec("sb1", map[string]string{"resume": c.mode})
			startReady(t, d, rec, s, 1)
			ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
			if err != nil {
				t.Fatal(err)
			}
			for i, a := range c.attempts {
				res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: "cred2", RestoreRef: ref})
				if (err == nil) != a.ok || res.Consumed != a.consumed {
					t.Fatalf("attempt %d = %+v, %v; want ok %v consumed %v", i+1, res, err, a.ok, a.consumed)
				}
				if a.ok {
					got := rec.next(t)
					wantReport(t, got, compute.ReportAttached, 2)
					if got.Credential != "cred2" {
						t.Fatalf("attach = %+v", got)
					}
				}
			}
		})
	}
}

func TestResumeIsIdempotentPerGenerationAndRef(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", nil)
	startReady(t, d, rec, s, 1)
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: "c", RestoreRef: ref})
		if err != nil || !res.Consumed {
			t.Fatalf("resume %d = %+v, %v", i+1, res, err)
		}
		wantReport(t, rec.next(t), compute.ReportAttached, 2)
	}
	// Another generation cannot use the consumed reference.
	res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 3, Credential: "c", RestoreRef: ref})
	if !errors.Is(err, compute.ErrUnknownRef) || res.Consumed {
		t.Fatalf("resume of a consumed ref = %+v, %v; want unknown ref, not consumed", res, err)
	}
}

func TestResumeUnknownRefs(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", nil)
	cases := []struct {
		name string
		ref  string
		ok   bool
	}{
		{"foreign prefix", "snap:sb1:1:x", false},
		{"another sandbox", "sim:sb2:1:x", false},
		{"never produced", "sim:sb1:1:abc", false},
	}
	for _, c := range cases {
		res, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: "c", RestoreRef: c.ref})
		if c.ok {
			if err != nil || !res.Consumed {
				t.Errorf("%s: resume = %+v, %v; want restored", c.name, res, err)
			}
			wantReport(t, rec.next(t), compute.ReportAttached, 2)
			continue
		}
		if !errors.Is(err, compute.ErrUnknownRef) || res.Consumed {
			t.Errorf("%s: resume = %+v, %v; want unknown ref", c.name, res, err)
		}
	}
}

func TestDiscardAndDeleteForgetRefs(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", nil)
	startReady(t, d, rec, s, 1)
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := d.Discard(ctx(t), s, ref); err != nil {
			t.Fatalf("discard %d: %v", i+1, err)
		}
	}
	if _, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, RestoreRef: ref}); !errors.Is(err, compute.ErrUnknownRef) {
		t.Fatalf("resume of a discarded ref = %v, want unknown ref", err)
	}

	startReady(t, d, rec, s, 3)
	ref, err = d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := d.Delete(ctx(t), s); err != nil {
			t.Fatalf("delete %d: %v", i+1, err)
		}
	}
	if _, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 4, RestoreRef: ref}); !errors.Is(err, compute.ErrUnknownRef) {
		t.Fatalf("resume after delete = %v, want unknown ref", err)
	}
}

func TestStopIsIdempotent(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", nil)
	startReady(t, d, rec, s, 1)
	for i := 0; i < 2; i++ {
		if err := d.Stop(ctx(t), compute.Target{Spec: s, Generation: 1}); err != nil {
			t.Fatalf("stop %d: %v", i+1, err)
		}
	}
	if err := d.Stop(ctx(t), compute.Target{Spec: spec("never", nil), Generation: 1}); err != nil {
		t.Fatalf("stop of an unknown sandbox: %v", err)
	}
}

func TestExitAfter(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", map[string]string{"exit_after": "10ms", "exit_code": "3"})
	startReady(t, d, rec, s, 1)
	got := rec.next(t)
	wantReport(t, got, compute.ReportExited, 1)
	if got.ExitCode != 3 || got.Credential != "cred" {
		t.Fatalf("exit = %+v", got)
	}
	// A repeated start of the exited generation starts nothing and sends
	// nothing: its workload has exited (reports are queued before a call
	// answers).
	if err := d.Start(ctx(t), compute.Start{Spec: s, Generation: 1, Credential: "cred"}); err != nil {
		t.Fatal(err)
	}
	rec.none(t)
	// The next generation exits again, with the default code when unset.
	s2 := spec("sb2", map[string]string{"exit_after": "1ms"})
	startReady(t, d, rec, s2, 5)
	got = rec.next(t)
	wantReport(t, got, compute.ReportExited, 5)
	if got.ExitCode != 0 || got.SandboxID != "sb2" {
		t.Fatalf("exit = %+v", got)
	}
	rec.none(t)
}

func TestExitAfterIsCancelledByStopSuspendDelete(t *testing.T) {
	for _, op := range []string{"stop", "suspend", "delete"} {
		t.Run(op, func(t *testing.T) {
			d, rec := newDriver(t)
			s := spec("sb1", map[string]string{"exit_after": "50ms"})
			startReady(t, d, rec, s, 1)
			var err error
			switch op {
			case "stop":
				err = d.Stop(ctx(t), compute.Target{Spec: s, Generation: 1})
			case "suspend":
				_, err = d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
			case "delete":
				err = d.Delete(ctx(t), s)
			}
			if err != nil {
				t.Fatal(err)
			}
			// A sandbox started now exits after 100ms; the cancelled one
			// would have exited before it, so the first exit seen tells.
			other := spec("sb2", map[string]string{"exit_after": "100ms"})
			startReady(t, d, rec, other, 1)
			got := rec.next(t)
			if got.SandboxID != "sb2" {
				t.Fatalf("first exit = %+v, want sb2's (sb1's timer should be cancelled)", got)
			}
		})
	}
}

func TestLatency(t *testing.T) {
	d, _ := newDriver(t)
	s := spec("sb1", map[string]string{"latency": "1h"})
	c, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := d.Start(c, compute.Start{Spec: s, Generation: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("start under latency = %v, want deadline exceeded", err)
	}
	s = spec("sb1", map[string]string{"latency": "5ms"})
	start := time.Now()
	if err := d.Stop(ctx(t), compute.Target{Spec: s, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 5*time.Millisecond {
		t.Fatalf("stop took %v, want at least the latency", el)
	}
}

func TestValidateOptions(t *testing.T) {
	cases := []struct {
		name string
		opts map[string]string
		want string // substring of the error; empty: valid
	}{
		{"none", nil, ""},
		{"all valid", map[string]string{"latency": "10ms", "suspend": "hang", "resume": "fail_once", "exit_during_suspend": "1", "exit_after": "1s", "exit_code": "2"}, ""},
		{"unknown key", map[string]string{"colour": "red"}, `"colour": unknown option`},
		{"bad latency", map[string]string{"latency": "soon"}, `"latency"`},
		{"negative latency", map[string]string{"latency": "-1s"}, "negative"},
		{"bad suspend", map[string]string{"suspend": "maybe"}, `"maybe" is not one of ok, reject, hang, unimplemented`},
		{"bad resume", map[string]string{"resume": "never"}, `"resume"`},
		{"bad exit code", map[string]string{"exit_code": "x"}, "not an integer"},
		{"exit code out of range", map[string]string{"exit_during_suspend": "300"}, "outside 0..255"},
		{"bad exit_after", map[string]string{"exit_after": "later"}, `"exit_after"`},
		{"attach never and an answer delay", map[string]string{"attach": "never", "answer_delay": "5ms"}, ""},
		{"a hanging resume and an observer that cannot tell", map[string]string{"resume": "hang", "observe": "unknown"}, ""},
		{"bad observe", map[string]string{"observe": "maybe"}, `"maybe" is not one of truth, unknown`},
		{"ports", map[string]string{"ports": "8000=127.0.0.1:1234,80=localhost:8080"}, ""},
		{"a port that is none", map[string]string{"ports": "http=127.0.0.1:80"}, `"ports"`},
		{"an address that is none", map[string]string{"ports": "80=nowhere"}, `"ports"`},
		{"bad attach", map[string]string{"attach": "soon"}, `"attach"`},
		{"negative answer delay", map[string]string{"answer_delay": "-1ms"}, "negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := sim.ValidateOptions(c.opts)
			if c.want == "" {
				if err != nil {
					t.Fatalf("ValidateOptions = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ValidateOptions = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestBadOptionsFailCallsWithoutPanic(t *testing.T) {
	d, _ := newDriver(t)
	s := spec("sb1", map[string]string{"suspend": "maybe"})
	if err := d.Start(ctx(t), compute.Start{Spec: s, Generation: 1}); err == nil {
		t.Fatal("start with bad options succeeded")
	}
	if _, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1}); err == nil {
		t.Fatal("suspend with bad options succeeded")
	}
	if _, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, RestoreRef: "sim:sb1:1:x"}); err == nil {
		t.Fatal("resume with bad options succeeded")
	}
}

func TestCloseStopsTimersAndCalls(t *testing.T) {
	rec := newRecorder()
	d, err := sim.New(rec, sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := spec("sb1", map[string]string{"exit_after": "1h"})
	if err := d.Start(ctx(t), compute.Start{Spec: s, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	rec.next(t)
	d.Close() // returns although a 1h timer is armed
	d.Close()
	if err := d.Start(ctx(t), compute.Start{Spec: s, Generation: 2}); !errors.Is(err, sim.ErrClosed) {
		t.Fatalf("start after close = %v, want ErrClosed", err)
	}
}

// TestJournalOutlivesTheProcess: with a directory, a sim started again finds
// what the first one did: a running workload (its supervisor attaching
// again if its attach was not taken), a frozen one behind its reference, a
// consumed reference that is never restored again, fail_once's count.
func TestJournalOutlivesTheProcess(t *testing.T) {
	dir := t.TempDir()
	d, rec := newDriverIn(t, dir)
	run, frozen, once := spec("run", nil), spec("frozen", map[string]string{"resume": "fail_once"}), spec("used", nil)
	startReady(t, d, rec, run, 1)
	startReady(t, d, rec, frozen, 1)
	startReady(t, d, rec, once, 1)
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: frozen, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Resume(ctx(t), compute.Resume{Spec: frozen, Generation: 2, Credential: "c2", RestoreRef: ref}); err == nil {
		t.Fatal("fail_once: the first restore succeeded")
	}
	used, err := d.Suspend(ctx(t), compute.Target{Spec: once, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Resume(ctx(t), compute.Resume{Spec: once, Generation: 2, Credential: "c2", RestoreRef: used}); err != nil {
		t.Fatal(err)
	}
	wantReport(t, rec.next(t), compute.ReportAttached, 2)
	// A workload whose attach was never taken: the reporter refuses it.
	late := spec("late", map[string]string{"attach": "1h"})
	if err := d.Start(ctx(t), compute.Start{Spec: late, Generation: 1, Credential: "c1"}); err != nil {
		t.Fatal(err)
	}
	d.Close()

	d2, rec2 := newDriverIn(t, dir)
	for _, c := range []struct {
		spec compute.Spec
		want compute.Observation
	}{
		{run, compute.Observation{State: compute.StateRunning, Generation: 1}},
		{frozen, compute.Observation{State: compute.StateFrozen, Generation: 1, RestoreRef: ref, How: "simulated"}},
		{once, compute.Observation{State: compute.StateRunning, Generation: 2, Consumed: used, ConsumedGeneration: 2}},
		{spec("never", nil), compute.Observation{State: compute.StateGone}},
	} {
		got, err := d2.Observe(ctx(t), c.spec)
		if err != nil || got != c.want {
			t.Errorf("observe %s after the restart: %+v, %v; want %+v", c.spec.SandboxID, got, err, c.want)
		}
	}
	// fail_once already failed once: the retry restores.
	if res, err := d2.Resume(ctx(t), compute.Resume{Spec: frozen, Generation: 2, Credential: "c2", RestoreRef: ref}); err != nil || !res.Consumed {
		t.Fatalf("retried restore after the restart: %+v, %v", res, err)
	}
	// The consumed reference stays consumed: a repeat by its generation
	// answers as before, another generation cannot have it.
	if res, err := d2.Resume(ctx(t), compute.Resume{Spec: once, Generation: 2, Credential: "c2", RestoreRef: used}); err != nil || !res.Consumed {
		t.Fatalf("repeated restore after the restart: %+v, %v", res, err)
	}
	if _, err := d2.Resume(ctx(t), compute.Resume{Spec: once, Generation: 3, RestoreRef: used}); !errors.Is(err, compute.ErrUnknownRef) {
		t.Fatalf("another generation's restore of a consumed reference: %v, want unknown ref", err)
	}
	// The late workload's supervisor attaches again (it is still an hour
	// away: it does not come now), the others were attached already.
	got := map[string]int64{}
	for i := 0; i < 2; i++ {
		r := rec2.next(t)
		got[r.SandboxID] = r.Generation
	}
	if want := map[string]int64{"frozen": 2, "used": 2}; !maps.Equal(got, want) {
		t.Fatalf("attaches after the restart %v, want the two restores' %v", got, want)
	}
	rec2.none(t)
}

// TestEffectsHappenOnce: the journal records each effect once per
// (sandbox, generation, operation), however often the call is repeated.
func TestEffectsHappenOnce(t *testing.T) {
	dir := t.TempDir()
	d, rec := newDriverIn(t, dir)
	s := spec("sb1", nil)
	for i := 0; i < 2; i++ {
		startReady(t, d, rec, s, 1)
	}
	var ref string
	for i := 0; i < 2; i++ {
		var err error
		if ref, err = d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		if _, err := d.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, Credential: "c", RestoreRef: ref}); err != nil {
			t.Fatal(err)
		}
		rec.next(t)
	}
	for i := 0; i < 2; i++ {
		if err := d.Stop(ctx(t), compute.Target{Spec: s, Generation: 2}); err != nil {
			t.Fatal(err)
		}
		if err := d.Delete(ctx(t), s); err != nil {
			t.Fatal(err)
		}
	}
	got, err := sim.Effects(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[sim.Effect]int{
		{Sandbox: "sb1", Generation: 1, Op: "start"}:   1,
		{Sandbox: "sb1", Generation: 1, Op: "suspend"}: 1,
		{Sandbox: "sb1", Generation: 2, Op: "resume"}:  1,
		{Sandbox: "sb1", Generation: 2, Op: "stop"}:    1,
		{Sandbox: "sb1", Generation: 2, Op: "delete"}:  1,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
}

// TestTornJournalLine: a kill in the middle of a write leaves a last line
// cut short; the next start drops it and writes on from a whole line.
func TestTornJournalLine(t *testing.T) {
	dir := t.TempDir()
	d, rec := newDriverIn(t, dir)
	startReady(t, d, rec, spec("sb1", nil), 1)
	d.Close()
	f, err := os.OpenFile(filepath.Join(dir, "sim", "journal"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"sandbox":"sb2","gen":1,"op":"sta`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	d2, rec2 := newDriverIn(t, dir)
	startReady(t, d2, rec2, spec("sb3", nil), 1)
	d2.Close()
	got, err := sim.Effects(dir)
	if err != nil {
		t.Fatalf("effects after a torn line: %v", err)
	}
	if len(got) != 2 || got[sim.Effect{Sandbox: "sb1", Generation: 1, Op: "start"}] != 1 || got[sim.Effect{Sandbox: "sb3", Generation: 1, Op: "start"}] != 1 {
		t.Fatalf("effects %v, want sb1's and sb3's starts", got)
	}
}

// TestObserve: what Observe says after each operation.
func TestObserve(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", nil)
	observe := func(want compute.Observation) {
		t.Helper()
		got, err := d.Observe(ctx(t), s)
		if err != nil || got != want {
			t.Fatalf("observe: %+v, %v; want %+v", got, err, want)
		}
	}
	observe(compute.Observation{State: compute.StateGone})
	startReady(t, d, rec, s, 1)
	observe(compute.Observation{State: compute.StateRunning, Generation: 1})
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	observe(compute.Observation{State: compute.StateFrozen, Generation: 1, RestoreRef: ref, How: "simulated"})
	if err := d.Discard(ctx(t), s, ref); err != nil {
		t.Fatal(err)
	}
	observe(compute.Observation{State: compute.StateStopped, Generation: 1})
	startReady(t, d, rec, s, 2)
	if err := d.Stop(ctx(t), compute.Target{Spec: s, Generation: 2}); err != nil {
		t.Fatal(err)
	}
	observe(compute.Observation{State: compute.StateStopped, Generation: 2})
	e := spec("sb2", map[string]string{"exit_after": "1ms", "exit_code": "4"})
	startReady(t, d, rec, e, 1)
	wantReport(t, rec.next(t), compute.ReportExited, 1)
	if got, _ := d.Observe(ctx(t), e); got != (compute.Observation{State: compute.StateExited, Generation: 1, ExitCode: 4}) {
		t.Fatalf("observe after the exit: %+v", got)
	}
	if err := d.Delete(ctx(t), s); err != nil {
		t.Fatal(err)
	}
	observe(compute.Observation{State: compute.StateGone})

	// A resume's consumption is observed, whether the restore then failed
	// (the state lost, nothing runs) or succeeded; a failure before it is not.
	for _, c := range []struct {
		resume string
		want   func(ref string) compute.Observation
	}{
		{"fail", func(ref string) compute.Observation {
			return compute.Observation{State: compute.StateFrozen, Generation: 1, RestoreRef: ref, How: "simulated"}
		}},
		{"fail_after_consume", func(ref string) compute.Observation {
			return compute.Observation{State: compute.StateStopped, Generation: 1, Consumed: ref, ConsumedGeneration: 2}
		}},
		{"ok", func(ref string) compute.Observation {
			return compute.Observation{State: compute.StateRunning, Generation: 2, Consumed: ref, ConsumedGeneration: 2}
		}},
	} {
		r := spec("resume-"+c.resume, map[string]string{"resume": c.resume})
		startReady(t, d, rec, r, 1)
		ref, err := d.Suspend(ctx(t), compute.Target{Spec: r, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = d.Resume(ctx(t), compute.Resume{Spec: r, Generation: 2, Credential: "c2", RestoreRef: ref})
		if got, err := d.Observe(ctx(t), r); err != nil || got != c.want(ref) {
			t.Errorf("resume=%s: observed %+v, %v; want %+v", c.resume, got, err, c.want(ref))
		}
	}
}

// TestAttachOption: attach=never runs the workload with no supervisor
// attaching; a duration delays the attach.
func TestAttachOption(t *testing.T) {
	d, rec := newDriver(t)
	never := spec("sb1", map[string]string{"attach": "never"})
	if err := d.Start(ctx(t), compute.Start{Spec: never, Generation: 1, Credential: "c"}); err != nil {
		t.Fatal(err)
	}
	later := spec("sb2", map[string]string{"attach": "20ms"})
	began := time.Now()
	if err := d.Start(ctx(t), compute.Start{Spec: later, Generation: 1, Credential: "c"}); err != nil {
		t.Fatal(err)
	}
	got := rec.next(t)
	if got.SandboxID != "sb2" || time.Since(began) < 20*time.Millisecond {
		t.Fatalf("first report %+v after %v; want sb2's attach, 20ms on", got, time.Since(began))
	}
	if o, _ := d.Observe(ctx(t), never); o.State != compute.StateRunning {
		t.Fatalf("attach=never: %+v, want running all the same", o)
	}
	rec.none(t)
}

// TestAnswerDelay: the effect is done when the call begins to wait; the
// answer comes after the delay (or not at all, when the caller gives up).
func TestAnswerDelay(t *testing.T) {
	dir := t.TempDir()
	d, rec := newDriverIn(t, dir)
	s := spec("sb1", map[string]string{"answer_delay": "1h"})
	c, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := d.Start(c, compute.Start{Spec: s, Generation: 1, Credential: "c"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("start under answer_delay: %v, want the caller's deadline", err)
	}
	wantReport(t, rec.next(t), compute.ReportAttached, 1)
	if got, _ := sim.Effects(dir); got[sim.Effect{Sandbox: "sb1", Generation: 1, Op: "start"}] != 1 {
		t.Fatalf("effects %v: the start is done", got)
	}
}

// TestResumeHangAndObserveUnknown: resume=hang blocks until the caller gives
// up, with no effect; observe=unknown makes Observe say it cannot tell.
func TestResumeHangAndObserveUnknown(t *testing.T) {
	d, rec := newDriver(t)
	s := spec("sb1", map[string]string{"resume": "hang", "observe": "unknown"})
	startReady(t, d, rec, s, 1)
	ref, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := d.Resume(c, compute.Resume{Spec: s, Generation: 2, RestoreRef: ref}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("resume=hang: %v, want the caller's deadline", err)
	}
	if _, err := d.Observe(ctx(t), s); !errors.Is(err, compute.ErrUnavailable) {
		t.Fatalf("observe=unknown: %v, want ErrUnavailable", err)
	}
	truth := spec("sb1", nil)
	if o, err := d.Observe(ctx(t), truth); err != nil || o.State != compute.StateFrozen || o.RestoreRef != ref {
		t.Fatalf("the state after the hang: %+v, %v; want still frozen behind %s", o, err, ref)
	}
}

// TestContract runs the driver contract suite against the sim, with its
// journal (as torpor serve runs it).
func TestContract(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Harness {
		rec := newRecorder()
		d, err := sim.New(rec, sim.Config{Data: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Close)
		return drivertest.Harness{
			Driver:  d,
			Reports: rec.ch,
			Spec:    func(id string) compute.Spec { return spec(id, nil) },
		}
	})
}

// TestLogs: the simulated workload says what happened to it, a line per
// change, kept across a restart of the sim (rebuilt from its journal).
func TestLogs(t *testing.T) {
	dir := t.TempDir()
	d, rec := newDriverIn(t, dir)
	s := spec("sb1", nil)
	startReady(t, d, rec, s, 1)
	if _, err := d.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d2, _ := newDriverIn(t, dir)
	out, err := d2.Logs(ctx(t), s, 2)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || lines[0] != "sim: the supervisor of generation 1 attached" || !strings.HasPrefix(lines[1], "sim: generation 1 suspended behind sim:sb1:1:") {
		t.Fatalf("logs %q", out)
	}
}
