package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// MeasureFreezer freezes and thaws a process group with freezer kind cycles
// times and returns how long each freeze and each thaw took, as Suspend and
// Resume make them: each returns once the kernel says every process of the
// group is frozen, or none is. The group is a shell that runs sleep in a
// loop (two processes, one of them replaced all the time), in a cgroup of
// its own for the cgroup freezers; it is ended and its cgroup removed
// before MeasureFreezer returns. `torpor bench` reports the figures.
func MeasureFreezer(ctx context.Context, kind string, cycles int) (freeze, thaw []time.Duration, err error) {
	parent, err := parentOf(kind)
	if err != nil {
		return nil, nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	cg, err := makeCgroup(ctx, kind, parent, "measure-"+hex.EncodeToString(b[:]))
	if err != nil {
		return nil, nil, err
	}
	// The shell waits on its stdin until it is in the cgroup, then loops;
	// it dies with its measurer (a bench or test killed mid-way left it
	// looping for ever).
	cmd := exec.Command("sh", "-c", `read _; while :; do sleep 0.01; done`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("measure %s: %w", kind, err)
	}
	g, err := groupOf(kind, cg, cmd.Process.Pid)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		_ = g.kill()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if rerr := removeCgroup(rctx, cg); rerr != nil && err == nil {
			err = rerr
		}
	}()
	if cg != "" {
		if err := joinCgroup(cg, cmd.Process.Pid); err != nil {
			return nil, nil, fmt.Errorf("measure %s: join the cgroup: %w", kind, err)
		}
	}
	if _, err := in.Write([]byte("\n")); err != nil {
		return nil, nil, err
	}
	for range cycles {
		t0 := time.Now()
		if err := g.freeze(ctx); err != nil {
			return freeze, thaw, fmt.Errorf("measure %s: freeze: %w", kind, err)
		}
		t1 := time.Now()
		if err := g.thaw(ctx); err != nil {
			return freeze, thaw, fmt.Errorf("measure %s: thaw: %w", kind, err)
		}
		freeze, thaw = append(freeze, t1.Sub(t0)), append(thaw, time.Since(t1))
		// A moment thawed, as between a resume and the next suspension: the
		// loop forks its next sleep.
		time.Sleep(time.Millisecond)
	}
	return freeze, thaw, nil
}
