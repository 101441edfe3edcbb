package vm

import (
	"context"
	"path/filepath"

	"github.com/torpor/torpor/services/compute"
)

// SetAfterCont sets the hook a test uses to kill a restored guest right
// after it was continued.
func SetAfterCont(c *Config, f func(pid int)) { c.afterCont = f }

// SetBeforeCont sets the hook that makes Resume return f's error just
// before it would continue the restored guest, as if the driver died there.
func SetBeforeCont(c *Config, f func() error) { c.beforeCont = f }

// InterruptSuspend leaves spec's running VM as a driver that died in the
// middle of its Suspend would: with recorded false, right after the guest
// was stopped and the migration of its device state began (to the
// temporary name); with recorded true, after the suspension was recorded
// but before QEMU quit. It returns the reference recorded, if any.
func InterruptSuspend(ctx context.Context, d *Driver, spec compute.Spec, recorded bool) (string, error) {
	dir, st, unlock, err := d.open(spec.SandboxID)
	defer unlock()
	if err != nil {
		return "", err
	}
	if recorded {
		s, err := d.snapshot(ctx, dir, st, spec)
		if err != nil {
			return "", err
		}
		st.Suspension = s
		return s.Ref, save(dir, st)
	}
	mo, err := dial(ctx, filepath.Join(dir, qmpSocket))
	if err != nil {
		return "", err
	}
	defer mo.close()
	if err := mo.ignoreShared(); err != nil {
		return "", err
	}
	if _, err := mo.run("stop", nil); err != nil {
		return "", err
	}
	_, err = mo.run("migrate", map[string]any{"uri": "exec:cat > " + shellPath(filepath.Join(dir, ".snap-interrupted.tmp"))})
	return "", err
}

// UserNet is what HMP info usernet says of spec's running QEMU: its
// user-mode network's forwards and connections.
func UserNet(ctx context.Context, d *Driver, spec compute.Spec) (string, error) {
	dir, _, unlock, err := d.open(spec.SandboxID)
	defer unlock()
	if err != nil {
		return "", err
	}
	mo, err := dial(ctx, filepath.Join(dir, qmpSocket))
	if err != nil {
		return "", err
	}
	defer mo.close()
	return mo.hmp("info usernet")
}

// ProbeTimeout is the bound of the KVM probe.
const ProbeTimeout = probeTimeout

// ForgetProbe forgets the process's KVM probe, so that the next driver
// without a forced accelerator probes again.
func ForgetProbe() { probed = kvmProbe{} }

// SetBeforeExport sets the hook an export calls before it writes anything.
func SetBeforeExport(c *Config, f func()) { c.beforeExport = f }

// ExportsUnderWay is how many exports of d run or wait to be recorded.
func ExportsUnderWay(d *Driver) int {
	d.ahead.mu.Lock()
	defer d.ahead.mu.Unlock()
	n := 0
	for _, e := range d.ahead.m {
		select {
		case <-e.done:
		default:
			n++
		}
	}
	return n
}

// Spare is the pid of the spare supervisor waiting for d's next start or
// restore, 0 when none waits.
func Spare(d *Driver) int {
	d.spareMu.Lock()
	defer d.spareMu.Unlock()
	if d.spare == nil {
		return 0
	}
	return d.spare.Proc.Pid
}

// Supervisor is the pid of the supervisor of spec's newest generation.
func Supervisor(d *Driver, spec compute.Spec) int {
	_, st, unlock, err := d.open(spec.SandboxID)
	defer unlock()
	if err != nil || st == nil {
		return 0
	}
	return st.Supervisor.Pid
}
