package process

import (
	"time"

	"github.com/torpor/torpor/services/compute/supervisor"
)

// cpuMeter measures the CPU time a group's processes used between two
// readings, from /proc/<pid>/stat of each (the same for every freezer:
// the processes of a cgroup, or of the process group), with
// supervisor.CPUMeter.
type cpuMeter struct{ m supervisor.CPUMeter }

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
	for _, pid := range pids {
		st, err := readStat(pid)
		if err != nil || st.Dead() {
			continue
		}
		cur[supervisor.Proc{Pid: pid, Start: st.Start}] = st.CPU
	}
	return m.m.Used(cur)
}

// busy says whether used CPU time over interval makes a workload active
// (supervisor.Busy: the same threshold for every driver).
func busy(used, interval time.Duration) bool { return supervisor.Busy(used, interval) }
