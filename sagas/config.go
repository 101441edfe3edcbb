package sagas

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/torpor/torpor/internal/metrics"
)

// Config tunes a Runner.
type Config struct {
	// Node is the node this runner drives; sandboxes created on other nodes
	// are left to their own runners, but for Nodes: other nodes whose
	// sandboxes this runner drives too (through their drivers on the bus).
	// A sandbox is driven by the runner of the node it is on, which
	// changes when a resume consumes its state on another node.
	Node  string
	Nodes []string
	// Deadline bounds every transient phase (default 2m).
	Deadline time.Duration
	// Workers bounds the driver steps running at once (default 64); the
	// passed deadlines being settled are bounded by as many again, in a
	// lane of their own, so that slow steps never delay a deadline.
	Workers int
	// CheckpointEvery is how often the Runner saves its Position while it
	// moves (default 1s); it also saves it when it stops. A crash re-reads
	// at most this much of the log, skipping the intents already settled.
	CheckpointEvery time.Duration
	// Grace is how long after the Runner starts a sandbox whose deadline
	// passed while the service was down, and whose workload the driver
	// observes running, is given for its supervisor to attach (a supervisor
	// retries its attach until a service answers). Default: the deadline,
	// at most 10s.
	Grace time.Duration
	// Metrics records the steps, the driver calls and the deadlines that
	// fire; nil records nothing.
	Metrics *metrics.Set
	// Fence, when set, says whether this runner may still act: it is asked
	// before each step, each record and each save of the position, and an
	// error keeps the runner from acting (the runner lost its node's lease,
	// another may be driving the node: jsstore.Lease.Held).
	Fence func() error
	// Unavailable, when set, is how long since a time this process found
	// the log unavailable (jsstore.Store.Unavailable): a deadline that
	// passes is extended by the outage within it, once per outage, and the
	// deadline_passed it finally records says by how much (extended).
	Unavailable func(since time.Time) time.Duration
	// Timers, when set, keeps the keys of the long timers armed (ttl,
	// retention, idle) between runs, so that the saved position passes
	// the events that armed them; nil: they hold the position (timer.go).
	Timers Timers
}

// Default values of Config.
const (
	DefaultDeadline = 2 * time.Minute
	DefaultWorkers  = 64
	// DefaultCheckpointEvery is the default of Config.CheckpointEvery.
	DefaultCheckpointEvery = time.Second
)

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Deadline == 0 {
		c.Deadline = DefaultDeadline
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.CheckpointEvery == 0 {
		c.CheckpointEvery = DefaultCheckpointEvery
	}
	if c.Grace == 0 {
		c.Grace = min(c.Deadline, 10*time.Second)
	}
	return c
}

// Validate reports the first problem of c, after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Node == "" || slices.Contains(c.Nodes, ""):
		return errors.New("sagas config: a node is empty")
	case c.Deadline < 0:
		return fmt.Errorf("sagas config: deadline %s is negative", c.Deadline)
	case c.Workers < 0:
		return fmt.Errorf("sagas config: workers %d is negative", c.Workers)
	case c.CheckpointEvery < 0:
		return fmt.Errorf("sagas config: checkpoint interval %s is negative", c.CheckpointEvery)
	case c.Grace < 0:
		return fmt.Errorf("sagas config: grace %s is negative", c.Grace)
	}
	return nil
}
