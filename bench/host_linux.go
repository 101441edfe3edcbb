//go:build linux

package bench

import (
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// cpuTime reads one of the kernel's CPU-time clocks.
func cpuTime(clock int32) (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}

// processCPU is the CPU time this process has used, all its threads, user
// and system.
func processCPU() (time.Duration, error) { return cpuTime(unix.CLOCK_PROCESS_CPUTIME_ID) }

// threadCPU is the CPU time the calling OS thread has used.
func threadCPU() (time.Duration, error) { return cpuTime(unix.CLOCK_THREAD_CPUTIME_ID) }

// probeLoop runs the host probe on a thread of its own until stop closes:
// every probeEvery, a fixed chunk of arithmetic, timed in the thread's own
// CPU time. The guest charges a thread for its time on the CPU, so the
// chunk costs the same however busy the process is, unless the machine
// under the guest runs it slower. It returns the chunks' CPU times.
func probeLoop(stop <-chan struct{}, iters int) []time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var out []time.Duration
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return out
		case <-t.C:
		}
		d, ok := chunk(iters)
		if !ok {
			return nil
		}
		out = append(out, d)
	}
}

// chunk runs iters steps of a linear congruential generator and returns the
// thread CPU time they took.
func chunk(iters int) (time.Duration, bool) {
	t0, err := threadCPU()
	if err != nil {
		return 0, false
	}
	x := uint64(1)
	for range iters {
		x = x*6364136223846793005 + 1
	}
	sink.Store(x)
	t1, _ := threadCPU()
	return t1 - t0, true
}

// calibrate returns how many iterations take about probeChunk, and the
// median CPU time of such a chunk on the machine as it is now.
func calibrate() (int, time.Duration, bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	iters := 10_000
	for range 20 {
		d, ok := chunk(iters)
		if !ok {
			return 0, 0, false
		}
		if d >= probeChunk {
			break
		}
		iters *= 2
	}
	ds := make([]time.Duration, 21)
	for i := range ds {
		ds[i], _ = chunk(iters)
	}
	slices.Sort(ds)
	return iters, ds[len(ds)/2], true
}
