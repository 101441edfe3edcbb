package vm_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/vm"
)

// TestKVMProbe (issue 29): a driver that forces no accelerator probes KVM
// with the real /dev/kvm: where a guest does not boot under it within the
// probe's bound (on this host a KVM boot hangs), it falls back to TCG
// within that bound and says why; where it boots, its VMs run under KVM.
// Capabilities (GET /v1/drivers) says nothing probed before and the answer
// after; a second driver of the process takes the answer without a probe.
// Which one this host gave is reported either way (under CI=true, whose
// machines may have no KVM at all, both are fine).
func TestKVMProbe(t *testing.T) {
	g := drivertest.NewGateway(t)
	vm.ForgetProbe()
	t.Cleanup(vm.ForgetProbe)
	d, cfg := newDriver(t, g, func(c *vm.Config) { c.Accel = "" })
	if c := d.Capabilities(nil); c.Accelerator != "" || !strings.HasPrefix(c.AcceleratorWhy, "not probed yet") {
		t.Fatalf("before any boot, capabilities say %q (%q); want none, not probed yet", c.Accelerator, c.AcceleratorWhy)
	}
	began := time.Now()
	kind, why := d.Accelerator(ctx(t))
	took := time.Since(began)
	t.Logf("REPORT: the KVM probe on this host: %s (%s) after %s", kind, why, took.Round(time.Millisecond))
	if c := d.Capabilities(nil); c.Accelerator != kind || c.AcceleratorWhy != why {
		t.Errorf("capabilities say %q (%q), want the probe's %q (%q)", c.Accelerator, c.AcceleratorWhy, kind, why)
	}
	_, noKVM := os.Stat("/dev/kvm")
	switch {
	case noKVM != nil:
		if kind != vm.AccelTCG || !strings.HasPrefix(why, "no KVM") {
			t.Errorf("without /dev/kvm: %s (%s), want tcg, no KVM", kind, why)
		}
	case kind == vm.AccelTCG:
		// The probe did not boot: the fallback, within the bound (and the
		// start and the end of its QEMU).
		if !strings.HasPrefix(why, "KVM probe failed, falling back to TCG") {
			t.Errorf("a failed probe says %q, want it to say it fell back", why)
		}
		if bound := vm.ProbeTimeout + 5*time.Second; took > bound {
			t.Errorf("the fallback took %s, want at most %s", took, bound)
		}
	case kind == vm.AccelKVM:
		s := spec("n1", counter...)
		start(t, d, g, s, 1)
		b, err := os.ReadFile(filepath.Join(cfg.Data, "vm", s.SandboxID, "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Accel string `json:"accel"`
		}
		if err := json.Unmarshal(b, &st); err != nil || st.Accel != vm.AccelKVM {
			t.Errorf("a VM after a probe that booted runs under %q (%v), want kvm", st.Accel, err)
		}
	default:
		t.Errorf("accelerator %q (%s), want kvm or tcg", kind, why)
	}
	d2, _ := newDriver(t, g, func(c *vm.Config) { c.Accel = "" })
	began = time.Now()
	if k2, w2 := d2.Accelerator(ctx(t)); k2 != kind || w2 != why {
		t.Errorf("a second driver of the process: %s (%s), want the first's %s (%s)", k2, w2, kind, why)
	}
	if again := time.Since(began); again > time.Second {
		t.Errorf("a second driver took %s for its accelerator: it probed again", again)
	}
}
