package sagas_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/sim"
)

// envSpy is the sim driver, telling the env each start is given.
type envSpy struct {
	*sim.Driver
	got chan map[string]string
}

func (d envSpy) Start(ctx context.Context, req compute.Start) error {
	d.got <- req.Spec.Env
	return d.Driver.Start(ctx, req)
}

// TestStartOpensTheEnv: the log holds env values sealed (the names with
// "(secret)"), and the driver that starts the workload gets them opened; an
// event from before sealing starts with its env as it is; a seal that does
// not open for the sandbox (copied from another) fails the start, and no
// workload starts with redacted values.
func TestStartOpensTheEnv(t *testing.T) {
	want := map[string]string{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI", "A": "1"}
	cases := []struct {
		name    string
		created func(h *harness, id string) *events.Created
		started bool
	}{
		{"sealed", func(h *harness, id string) *events.Created {
			red, sealed, err := h.creds.SealEnv(id, want)
			if err != nil {
				t.Fatal(err)
			}
			return &events.Created{Name: "sb", Driver: "sim", Node: node, Env: red, EnvSealed: sealed, Generation: 1}
		}, true},
		{"in clear, from before", func(h *harness, id string) *events.Created {
			return &events.Created{Name: "sb", Driver: "sim", Node: node, Env: maps.Clone(want), Generation: 1}
		}, true},
		{"sealed for another sandbox", func(h *harness, id string) *events.Created {
			red, sealed, err := h.creds.SealEnv(uuid.NewString(), want)
			if err != nil {
				t.Fatal(err)
			}
			return &events.Created{Name: "sb", Driver: "sim", Node: node, Env: red, EnvSealed: sealed, Generation: 1}
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, sagas.Config{})
			spy := envSpy{Driver: h.sim, got: make(chan map[string]string, 4)}
			h.run(spy)
			sb := &sandbox{h: h, id: uuid.Must(uuid.NewV7()).String()}
			intent := sb.when(tc.created(h, sb.id))
			out := sb.outcome(intent, 1)
			if !tc.started {
				if _, ok := out[0].(*events.StartFailed); !ok {
					t.Fatalf("outcome %T, want a failed start", out[0])
				}
				if len(spy.got) != 0 {
					t.Fatalf("the driver was asked to start with env %v", <-spy.got)
				}
				return
			}
			select {
			case got := <-spy.got:
				if !maps.Equal(got, want) {
					t.Fatalf("the driver got env %v, want %v", got, want)
				}
			case <-time.After(wait):
				t.Fatal("no start")
			}
		})
	}
}
