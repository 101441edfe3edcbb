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

func readCost(ns *server.Server) (cost, error) {
	cpu, err := processCPU()
	if err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return cost{}, fmt.Errorf("process CPU time: %w", err)
	}
	v, err := ns.Varz(nil)
	if err != nil {
		return cost{}, fmt.Errorf("varz: %w", err)
	}
	return cost{at: time.Now(), cpu: cpu, in: v.InMsgs, out: v.OutMsgs}, nil
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
