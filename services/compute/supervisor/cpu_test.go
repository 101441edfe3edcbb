package supervisor

import (
	"testing"
	"time"
)

// TestCPUMeter: what a meter says over readings of tasks that come and go.
func TestCPUMeter(t *testing.T) {
	a, b, a2 := Proc{Pid: 10, Start: 1}, Proc{Pid: 11, Start: 1}, Proc{Pid: 10, Start: 9}
	var m CPUMeter
	for _, tc := range []struct {
		name string
		now  map[Proc]uint64
		want time.Duration
	}{
		{"the first reading is 0", map[Proc]uint64{a: 500}, 0},
		{"ticks since the reading before", map[Proc]uint64{a: 520}, 200 * time.Millisecond},
		{"nothing used", map[Proc]uint64{a: 520}, 0},
		{"a task started in between counts whole", map[Proc]uint64{a: 521, b: 30}, 310 * time.Millisecond},
		{"a task gone counts nothing more", map[Proc]uint64{b: 31}, 10 * time.Millisecond},
		{"a pid reused is another task", map[Proc]uint64{b: 31, a2: 4}, 40 * time.Millisecond},
		{"no task", nil, 0},
	} {
		if got := m.Used(tc.now); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestBusy: active above a fiftieth of the interval (README "Activity").
func TestBusy(t *testing.T) {
	for _, tc := range []struct {
		used, interval time.Duration
		want           bool
	}{
		{100 * time.Millisecond, 5 * time.Second, false},
		{110 * time.Millisecond, 5 * time.Second, true},
		{20 * time.Millisecond, time.Second, false},
		{30 * time.Millisecond, time.Second, true},
		{0, time.Second, false},
	} {
		if got := Busy(tc.used, tc.interval); got != tc.want {
			t.Errorf("Busy(%s, %s) = %v, want %v", tc.used, tc.interval, got, tc.want)
		}
	}
}
