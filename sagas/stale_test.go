package sagas_test

import (
	"context"
	"encoding/json"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/sim"
	"github.com/torpor/torpor/services/gateway"
)

// gatewayDrivers is the compute side as a gateway sees it: the sim, which
// can suspend.
type gatewayDrivers struct{}

func (gatewayDrivers) Validate(string, compute.Spec) error { return nil }
func (gatewayDrivers) Capabilities(string, map[string]string) (compute.Capabilities, error) {
	return compute.Capabilities{Suspend: true}, nil
}
func (gatewayDrivers) Names() []string { return []string{"sim"} }
func (gatewayDrivers) Logs(context.Context, string, compute.Spec, int) ([]byte, error) {
	return nil, compute.ErrUnimplemented
}
func (gatewayDrivers) Dial(context.Context, string, compute.Spec, int) (net.Conn, error) {
	return nil, compute.ErrUnimplemented
}

// memPosition is a Runner's position kept in memory.
type memPosition struct {
	mu  sync.Mutex
	seq uint64
}

func (p *memPosition) Get(context.Context) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq, nil
}

func (p *memPosition) Set(_ context.Context, seq uint64) error {
	p.mu.Lock()
	p.seq = seq
	p.mu.Unlock()
	return nil
}

// TestSuspendRecordedThroughAStaleInstance: two gateway instances on one
// log; the suspend is taken by one, the runner records its outcome through
// the other, which cached the sandbox ready (it took the supervisor's
// attach). The sandbox ends suspended, its reference held. The stale
// instance refused sandbox.suspended, the saga took the refusal for a
// racing exit and discarded the reference, and the sandbox sat in
// suspending until its deadline.
func TestSuspendRecordedThroughAStaleInstance(t *testing.T) {
	lr := newLogRig(t)
	ctx, store := context.Background(), lr.store
	instance := func() *gateway.Service {
		svc, err := gateway.NewService(store, lr.names, gatewayDrivers{}, lr.creds, gateway.Config{}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	a, b := instance(), instance()
	// The sim's supervisor reports reach b.
	drv, err := sim.New(compute.ReporterFunc(func(ctx context.Context, r compute.Report) error {
		data, _ := json.Marshal(r)
		_, err := b.Report(ctx, r.SandboxID, data)
		return err
	}), sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drv.Close)
	r, err := sagas.New(store, &memPosition{}, b, compute.Registry{"sim": drv}, lr.creds,
		sagas.Config{Node: "local", CheckpointEvery: time.Millisecond}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, r)

	v, err := a.Handle(ctx, gateway.Command{Verb: gateway.VerbCreate})
	if err != nil {
		t.Fatal(err)
	}
	types := func() []string {
		envs, err := store.Load(ctx, v.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]string, len(envs))
		for i, e := range envs {
			out[i] = e.Type
		}
		return out
	}
	waitFor := func(typ string) {
		t.Helper()
		deadline := time.Now().Add(wait)
		for !slices.Contains(types(), typ) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s in %s: log %v", typ, wait, types())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(events.TypeSupervisorAttached) // b caches it ready
	if _, err := a.Handle(ctx, gateway.Command{Verb: gateway.VerbSuspend, ID: v.ID}); err != nil {
		t.Fatal(err)
	}
	waitFor(events.TypeSuspended)
	sb, err := instance().Sandbox(ctx, v.ID)
	if err != nil || sb.Phase != events.PhaseSuspended || sb.RestoreRef == "" {
		t.Fatalf("after the suspend: %+v, %v; want suspended, its reference held", sb, err)
	}
}
