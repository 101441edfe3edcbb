package vm

import (
	"testing"
	"time"
)

// TestVCPUBusy: under TCG a guest is active above 7% of a CPU over the
// interval (an idle guest's vCPU thread measured up to 3%), under KVM
// above the process driver's 2%.
func TestVCPUBusy(t *testing.T) {
	for _, tc := range []struct {
		accel    string
		used     time.Duration
		interval time.Duration
		want     bool
	}{
		{AccelTCG, 30 * time.Millisecond, time.Second, false}, // the most an idle guest measured
		{AccelTCG, 70 * time.Millisecond, time.Second, false},
		{AccelTCG, 80 * time.Millisecond, time.Second, true},
		{AccelTCG, 410 * time.Millisecond, time.Second, true}, // the least a spinning guest measured
		{AccelTCG, 350 * time.Millisecond, 5 * time.Second, false},
		{AccelTCG, 360 * time.Millisecond, 5 * time.Second, true},
		{AccelKVM, 30 * time.Millisecond, time.Second, true},
		{AccelKVM, 20 * time.Millisecond, time.Second, false},
	} {
		if got := vcpuBusy(tc.used, tc.interval, tc.accel); got != tc.want {
			t.Errorf("vcpuBusy(%s, %s, %s) = %v, want %v", tc.used, tc.interval, tc.accel, got, tc.want)
		}
	}
}
