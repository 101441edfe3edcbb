package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	torpor "github.com/torpor/torpor/sdk/go"
)

// vmWakePort is the port the woken guest serves HTTP on, inside the guest.
const vmWakePort = 8080

// RunVMWake measures the wake row of a vm sandbox, as RunWake does for a
// process sandbox: one microVM (same node) with wake_on_traffic serving
// HTTP (busybox httpd in the guest), suspended and then woken by a request
// through its forward, 5 times (each wake is a resume of the guest, the
// boot before them seconds under TCG). Missing says why it could not run:
// the vm driver's parts are not here, or the guest's network modules.
func RunVMWake(ctx context.Context, cfg Config, start Starter, progress io.Writer) (*Wake, error) {
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, err
	}
	w := &Wake{Rounds: 5}
	dir, err := os.MkdirTemp("", "torpor-bench-wake-vm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	probe, missing, err := vmProbe(dir)
	if err != nil || missing != "" {
		w.Rounds, w.Missing = 0, missing
		return w, err
	}
	if err := probe.Unnetworked(); err != nil {
		w.Rounds, w.Missing = 0, err.Error()
		return w, nil
	}
	w.Accel, _ = probe.Accelerator(ctx)
	svc, err := start(ctx, dir, "interval")
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.Stop() }()
	c := httpClient(svc, 1)
	var ids []string
	defer func() { deleteAll(ctx, c, ids) }()
	r := torpor.CreateRequest{Driver: "vm", WakeOnTraffic: true, Command: []string{"sh", "-c",
		"echo woken > /index.html; exec httpd -f -p " + strconv.Itoa(vmWakePort) + " -h /"}}
	// A boot under emulation takes seconds, more on a busy machine.
	if _, err := createEach(ctx, c, r, 1, 3*time.Minute, &ids); err != nil {
		return nil, fmt.Errorf("wake vm: %w", err)
	}
	id := ids[0]
	// A forward opens once something listens on the port: httpd, a moment
	// after the guest is ready.
	var addr string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if addr, err = openForward(ctx, svc, id, vmWakePort); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("wake vm: %w", err)
		}
	}
	fmt.Fprintf(progress, "bench: wake: a vm sandbox (%s) suspended and woken through its forward %d times\n", w.Accel, w.Rounds)
	if w.Latency, err = wakeRounds(ctx, c, id, addr, w.Rounds); err != nil {
		return nil, fmt.Errorf("wake vm: %w", err)
	}
	return w, nil
}
