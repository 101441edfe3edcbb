package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// AppendTraffic appends events to the sandboxes of ids as commands would
// (each with the expected last sequence of its sandbox, kept in heads):
// forward closures, which the lifecycle table takes in every phase but
// deleted (in whatever phase each sandbox is, its view moves), until ctx
// ends; n counts the appends. It is the live traffic a rebuild test swaps a
// view in under.
func AppendTraffic(t *testing.T, ctx context.Context, store events.Store, ids []string, heads map[string]uint64, n *atomic.Int64) {
	rnd := rand.New(rand.NewPCG(9, 9))
	for i := 0; ctx.Err() == nil; i++ {
		id := ids[rnd.IntN(len(ids))]
		var e events.Event = &events.ForwardClosed{ForwardID: fmt.Sprint("traffic-", i)}
		phase := events.Phase("") // the table's to say
		env, err := events.NewEnvelope(id, e, events.Meta{Actor: "traffic", CommandID: fmt.Sprint("traffic-", i)}, time.Now())
		if err != nil {
			t.Errorf("envelope: %v", err)
			return
		}
		env.Phase = phase
		seq, err := store.Append(ctx, id, heads[id], env)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			t.Errorf("append: %v", err)
			return
		}
		heads[id] = seq
		n.Add(1)
	}
}
