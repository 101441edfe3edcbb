package vm

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// probed is the process's KVM probe (issue 29): each process probes once,
// whichever of its drivers asks first (the bench's and a node's alike), and
// every driver that forces no accelerator takes the answer.
var probed kvmProbe

// kvmProbe is one probe of KVM: /dev/kvm opens, and a guest boots under it
// within probeTimeout; else TCG, saying why.
type kvmProbe struct {
	once sync.Once
	kind string
	why  string
	took time.Duration
}

// pick probes once, booting m (its RAM, console and sockets in dir) under
// KVM, and logs the answer.
func (p *kvmProbe) pick(ctx context.Context, m machine, dir string) (string, string) {
	p.once.Do(func() {
		began := time.Now()
		p.kind, p.why = probeAccel(ctx, m, dir)
		p.took = time.Since(began)
		if strings.HasPrefix(p.why, "KVM probe") {
			p.why += " (the probe took " + p.took.Round(time.Millisecond).String() + ")"
		}
	})
	return p.kind, p.why
}

// probeAccel is KVM where /dev/kvm opens and a guest boots under it in
// time, else TCG; and why.
func probeAccel(ctx context.Context, m machine, dir string) (string, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return AccelTCG, "no KVM: " + err.Error()
	}
	f.Close()
	if err := probeKVM(ctx, m, dir); err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			// Not KVM's failure: the asker went away. Still TCG for
			// this process, saying so.
			return AccelTCG, "KVM probe cut short: " + err.Error()
		}
		return AccelTCG, "KVM probe failed, falling back to TCG: " + err.Error()
	}
	return AccelKVM, "KVM probe booted"
}

// known is a's answer if it has one, without probing: ok false before the
// first VM (or Accelerator) asked.
func (a *accel) known() (kind, why string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.kind, a.why, a.set
}

// logAccel logs which accelerator the driver's VMs get and why, once per
// driver: a warning when a KVM probe failed and TCG is the fallback.
func logAccel(log zerolog.Logger, kind, why string) {
	ev := log.Info()
	if kind == AccelTCG && strings.HasPrefix(why, "KVM probe") {
		ev = log.Warn()
	}
	ev.Str("driver", "vm").Str("accelerator", kind).Str("why", why).Msg("vm accelerator")
}

// accelKnown is the accelerator the driver's VMs get and why, as
// Capabilities says it (GET /v1/drivers): the probe's answer once a VM (or
// Accelerator) asked, which it never starts itself, or why there is none
// yet.
func (d *Driver) accelKnown() (string, string) {
	if kind, why, ok := d.accel.known(); ok {
		return kind, why
	}
	if d.cfg.Accel != "" {
		return d.cfg.Accel, "configured"
	}
	return "", "not probed yet: the first vm boot probes KVM (a boot under it within " + probeTimeout.String() + ", else TCG)"
}
