package bench

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// cost is a reading of what this process and its embedded server have spent
// so far: the process's CPU time (the service, the server and the bench's
// clients alike) and the messages the server has taken in and sent out. The
// difference of two readings is a section's cost. The CPU time is read on
// Linux only; elsewhere it stays zero.
type cost struct {
	at      time.Time
	cpu     time.Duration
	in, out int64
}

// readCost reads the process's CPU time and the messages of the servers
// (one, or each of an in-process cluster's, summed).
func readCost(servers ...*server.Server) (cost, error) {
	cpu, err := processCPU()
	if err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return cost{}, fmt.Errorf("process CPU time: %w", err)
	}
	c := cost{at: time.Now(), cpu: cpu}
	for _, ns := range servers {
		v, err := ns.Varz(nil)
		if err != nil {
			return cost{}, fmt.Errorf("varz: %w", err)
		}
		c.in, c.out = c.in+v.InMsgs, c.out+v.OutMsgs
	}
	return c, nil
}

// spent is the CPU time per transition in milliseconds, the share of the
// machine's cores busy, and the server's messages (in and out) per event,
// from reading c0 to c over transitions and events.
func (c cost) spent(c0 cost, transitions int, events uint64) (msPerTransition, coresBusy, msgsPerEvent float64) {
	cpu := (c.cpu - c0.cpu).Seconds()
	if transitions > 0 {
		msPerTransition = 1000 * cpu / float64(transitions)
	}
	if wall := c.at.Sub(c0.at).Seconds(); wall > 0 {
		coresBusy = cpu / wall / float64(runtime.NumCPU())
	}
	if events > 0 {
		msgsPerEvent = float64(c.in-c0.in+c.out-c0.out) / float64(events)
	}
	return msPerTransition, coresBusy, msgsPerEvent
}

// sectionCost is what a section of transitions cost: CPU ms per transition
// and the share of the cores busy meanwhile.
type sectionCost struct{ msPerTransition, coresBusy float64 }

// costOf runs f, which returns how many transitions it made, and says what
// it cost, read from ns and this process before and after.
func costOf(ns *server.Server, f func() (int, error)) (sectionCost, error) {
	c0, err := readCost(ns)
	if err != nil {
		return sectionCost{}, err
	}
	n, err := f()
	if err != nil {
		return sectionCost{}, err
	}
	c1, err := readCost(ns)
	if err != nil {
		return sectionCost{}, err
	}
	ms, busy, _ := c1.spent(c0, n, 0)
	return sectionCost{msPerTransition: ms, coresBusy: busy}, nil
}
