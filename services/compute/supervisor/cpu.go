package supervisor

import "time"

// ClockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times: 100 on every Linux this runs on.
const ClockTicks = 100

// activeShare is the share of one CPU, over a heartbeat's interval, above
// which a workload is reported active (README "Activity"): a fiftieth,
// 100 ms of CPU in the default 5 s. The same for every driver that
// measures it: the process driver's group, the vm driver's vCPU threads.
const activeShare = 50

// Busy says whether used CPU time over interval makes a workload active.
func Busy(used, interval time.Duration) bool { return used > interval/activeShare }

// CPUMeter measures the CPU time a set of tasks (processes or threads)
// used between two readings. A task that ended between two readings takes
// the time it used since the first with it; one that started in between
// counts whole.
type CPUMeter struct {
	last   map[Proc]uint64
	primed bool
}

// Used takes the tasks' CPU times now (Stat.CPU, in clock ticks, by task)
// and returns the CPU time they used since the reading before; the first
// reading is 0.
func (m *CPUMeter) Used(now map[Proc]uint64) time.Duration {
	var ticks uint64
	for k, cpu := range now {
		if prev := m.last[k]; cpu > prev {
			ticks += cpu - prev
		}
	}
	m.last = now
	if !m.primed {
		m.primed = true
		return 0
	}
	return time.Duration(ticks) * time.Second / ClockTicks
}
