package process

import (
	"context"
	"fmt"
	"path/filepath"
)

// Dir is sandbox id's directory.
func Dir(d *Driver, id string) string { return filepath.Join(d.root, id) }

// Pids are the pids of sandbox id's supervisor and workload, as the
// driver recorded them (0 for none).
func Pids(d *Driver, id string) (supervisor, workload int) {
	st, err := load(Dir(d, id))
	if err != nil || st == nil {
		return 0, 0
	}
	return st.Supervisor.Pid, st.Workload.Pid
}

// Cgroup is the cgroup directory of sandbox id ("" with SIGSTOP).
func Cgroup(d *Driver, id string) string {
	st, err := load(Dir(d, id))
	if err != nil || st == nil {
		return ""
	}
	return st.Cgroup
}

// FreezeThaw are the freeze and the thaw of sandbox id's group, as Suspend
// and Resume do them, for the benchmarks.
func FreezeThaw(d *Driver, id string) (freeze, thaw func(context.Context) error, err error) {
	st, err := load(Dir(d, id))
	if err != nil {
		return nil, nil, err
	}
	if st == nil {
		return nil, nil, fmt.Errorf("no sandbox %s", id)
	}
	g, err := st.group()
	if err != nil {
		return nil, nil, err
	}
	return g.freeze, g.thaw, nil
}
