package sagas_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
)

// startsSeen is a driver that keeps the bus credentials of every start it
// is asked for; it is no compute.SelfReporting.
type startsSeen struct {
	compute.Driver
	mu   sync.Mutex
	seen []string
}

func (d *startsSeen) Start(ctx context.Context, req compute.Start) error {
	d.mu.Lock()
	d.seen = append(d.seen, req.BusCreds)
	d.mu.Unlock()
	return d.Driver.Start(ctx, req)
}

func (d *startsSeen) first(t *testing.T) string {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.seen) == 0 {
		t.Fatal("no start")
	}
	return d.seen[0]
}

// selfReporting is startsSeen for a driver that reports for its sandboxes
// itself (the sim).
type selfReporting struct{ *startsSeen }

func (selfReporting) ReportsItself() bool { return true }

// TestStartCarriesTheSupervisorsBusUser: a start gets the NATS user the
// credentials mint for its sandbox and generation, except on a driver
// that reports for its sandboxes itself.
func TestStartCarriesTheSupervisorsBusUser(t *testing.T) {
	for _, tc := range []struct {
		name string
		self bool
		want func(id string) string
	}{
		{"supervised", false, func(id string) string { return fmt.Sprintf("user of %s generation 1", id) }},
		{"self-reporting", true, func(string) string { return "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, sagas.Config{})
			h.creds = h.creds.WithBus(func(id string, gen int64) (string, error) {
				return fmt.Sprintf("user of %s generation %d", id, gen), nil
			})
			seen := &startsSeen{Driver: h.sim}
			var drv compute.Driver = seen
			if tc.self {
				drv = selfReporting{seen}
			}
			h.run(drv)
			sb, created := h.create(node, nil)
			sb.then(sb.outcome(created, 1), &events.Started{Generation: 1})
			if got, want := seen.first(t), tc.want(sb.id); got != want {
				t.Errorf("start's bus credentials %q, want %q", got, want)
			}
		})
	}
}
