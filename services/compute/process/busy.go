package process

import (
	"time"

	"github.com/torpor/torpor/services/compute/supervisor"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times: 100 on every Linux this runs on.
const clockTicks = 100

// activeShare is the share of one CPU, over a heartbeat's interval, above
// which the workload is reported active (README "Activity"): a fiftieth,
// 100 ms of CPU in the default 5 s.
const activeShare = 50

// cpuMeter measures the CPU time a group's processes used between two
// readings, from /proc/<pid>/stat of each (the same for every freezer:
// the processes of a cgroup, or of the process group). A process that
// ended between two readings takes the time it used since the first with
// it; one that started in between counts whole.
type cpuMeter struct {
	last   map[supervisor.Proc]uint64
	primed bool
}

// used is the CPU time g's processes used since the reading before; the
// first reading is 0.
func (m *cpuMeter) used(g group) time.Duration {
	if g == nil {
		return 0
	}
	pids, err := g.pids()
	if err != nil {
		return 0
	}
	cur := make(map[supervisor.Proc]uint64, len(pids))
	var ticks uint64
	for _, pid := range pids {
		st, err := readStat(pid)
		if err != nil || st.Dead() {
			continue
		}
		k := supervisor.Proc{Pid: pid, Start: st.Start}
		cur[k] = st.CPU
		if prev := m.last[k]; st.CPU > prev {
			ticks += st.CPU - prev
		}
	}
	m.last = cur
	if !m.primed {
		m.primed = true
		return 0
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// busy says whether used CPU time over interval makes a workload active.
func busy(used, interval time.Duration) bool { return used > interval/activeShare }
