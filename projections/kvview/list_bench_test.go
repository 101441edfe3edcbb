package kvview

import (
	"context"
	"fmt"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
)

// BenchmarkListSortedByName lists the first page of 100 views sorted by
// name, and their total, from a bucket of 10,000 views (an in-process
// nats-server, as the node embeds): what the dashboard's first paint asks
// of a fleet of that size.
func BenchmarkListSortedByName(b *testing.B) {
	const fleet = 10_000
	v, err := New(context.Background(), natstest.Start(b).JS, Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	envs := make([]events.Envelope, 0, 500)
	for i := range fleet {
		id := benchID(b, i)
		env, err := events.NewEnvelope(id, &events.Created{Name: fmt.Sprintf("sbx-%05d", (i*7919)%fleet), Driver: "sim", Node: "n1",
			Labels: map[string]string{"team": fmt.Sprint(i % 10)}, Generation: 1}, events.Meta{Actor: "bench"}, t0)
		if err != nil {
			b.Fatal(err)
		}
		env.Seq, env.Phase = uint64(i+1), events.PhaseProvisioning
		if envs = append(envs, env); len(envs) == cap(envs) || i == fleet-1 {
			if err := v.ApplyBatch(ctx, envs); err != nil {
				b.Fatal(err)
			}
			envs = envs[:0]
		}
	}
	q := Query{Sort: "name", Limit: 100}
	for b.Loop() {
		page, err := v.List(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		if len(page.Items) != 100 || page.Total != fleet || page.Items[0].Name != "sbx-00000" {
			b.Fatalf("page of %d, total %d, first %q: want 100 of %d from sbx-00000", len(page.Items), page.Total, page.Items[0].Name, fleet)
		}
	}
}

// benchID is the i-th of a run of uuid v7 ids, in order.
func benchID(b *testing.B, i int) string {
	b.Helper()
	return fmt.Sprintf("01900000-0000-7000-8000-%012x", i)
}
