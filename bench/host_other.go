//go:build !linux

package bench

import (
	"errors"
	"time"
)

// The bench reads CPU-time clocks on Linux only: elsewhere its CPU figures
// stay zero and the host probe does not run.
func processCPU() (time.Duration, error) { return 0, errors.ErrUnsupported }

func probeLoop(stop <-chan struct{}, iters int) []time.Duration {
	<-stop
	return nil
}

func calibrate() (int, time.Duration, bool) { return 0, 0, false }
