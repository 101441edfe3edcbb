package kvview

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
)

// step is one kind of lifecycle event and the phase it leaves behind.
type step struct {
	phase events.Phase
	make  func(g int64, r *rand.Rand) events.Event
}

// steps are the events a random lifecycle draws from after sandbox.created.
var steps = []step{
	{events.PhaseStarting, func(g int64, r *rand.Rand) events.Event {
		return &events.StartRequested{Generation: g, Fallback: r.IntN(4) == 0}
	}},
	{events.PhaseReady, func(g int64, _ *rand.Rand) events.Event { return &events.Started{Generation: g, CredentialHash: "h"} }},
	{events.PhaseReady, func(g int64, _ *rand.Rand) events.Event { return &events.SupervisorAttached{Generation: g} }},
	{events.PhaseError, func(g int64, _ *rand.Rand) events.Event { return &events.StartFailed{Generation: g, Message: "no"} }},
	{events.PhaseStopping, func(g int64, _ *rand.Rand) events.Event { return &events.StopRequested{Generation: g} }},
	{events.PhaseStopped, func(g int64, r *rand.Rand) events.Event {
		return &events.Stopped{Generation: g, Reason: []string{"", events.ReasonMainProcessExited}[r.IntN(2)]}
	}},
	{events.PhaseSuspending, func(g int64, _ *rand.Rand) events.Event { return &events.SuspendRequested{Generation: g} }},
	{events.PhaseSuspended, func(g int64, _ *rand.Rand) events.Event { return &events.Suspended{Generation: g, RestoreRef: "r"} }},
	{events.PhaseReady, func(g int64, r *rand.Rand) events.Event {
		return &events.SuspendRejected{Generation: g, Reason: []string{"", events.ReasonDeadlineExceeded}[r.IntN(2)]}
	}},
	{events.PhaseStarting, func(g int64, _ *rand.Rand) events.Event {
		return &events.ResumeRequested{Generation: g + 1, RestoreRef: "r"}
	}},
	{events.PhaseStarting, func(g int64, _ *rand.Rand) events.Event { return &events.RetainedStateConsumed{Generation: g} }},
	{events.PhaseSuspended, func(int64, *rand.Rand) events.Event { return &events.RetainedStateDiscarded{RestoreRef: "r"} }},
	{events.PhaseStarting, func(g int64, _ *rand.Rand) events.Event { return &events.ResumeFailed{Generation: g} }},
	{events.PhaseReady, func(g int64, _ *rand.Rand) events.Event {
		return &events.Resumed{Generation: g, Outcome: events.OutcomeRestored}
	}},
	{events.PhaseError, func(g int64, r *rand.Rand) events.Event { return &events.Exited{Generation: g, Code: r.IntN(3)} }},
	{events.PhaseError, func(g int64, _ *rand.Rand) events.Event { return &events.ResourceLost{Generation: g} }},
	{events.PhaseError, func(int64, *rand.Rand) events.Event { return &events.DeadlinePassed{Deadline: "2m"} }},
	{events.PhaseDeleting, func(int64, *rand.Rand) events.Event { return &events.DeleteRequested{} }},
	{events.PhaseDeleted, func(int64, *rand.Rand) events.Event { return &events.Deleted{} }},
}

// randomLog is n events over up to sandboxes sandboxes, each starting with
// sandbox.created, then random lifecycle events the table accepts in the
// sandbox's phase, and now and then (or when every sandbox tried is
// deleted) an event of a type this build does not know. Seq is set to the
// position in the log, from 1.
func randomLog(tb testing.TB, seed uint64, sandboxes, n int) []events.Envelope {
	tb.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	ids := make([]string, sandboxes)
	gens := make([]int64, sandboxes)
	phases := make([]events.Phase, sandboxes)
	out := make([]events.Envelope, 0, n)
	for len(out) < n {
		i := r.IntN(sandboxes)
		for try := 0; try < 100 && phases[i].Terminal(); try++ {
			i = r.IntN(sandboxes) // little follows deleted or error
		}
		var e events.Event
		phase := events.PhaseProvisioning
		switch {
		case phases[i] == events.PhaseDeleted:
			e, phase = &events.Deleted{}, events.PhaseDeleted // sent as an unknown type below
		case phases[i] == events.PhaseNone:
			if ids[i] == "" {
				id, err := uuid.NewV7()
				if err != nil {
					tb.Fatalf("uuid: %v", err)
				}
				ids[i] = id.String()
			}
			gens[i] = 1
			e = &events.Created{Name: fmt.Sprintf("box-%d", i), Driver: "sim", Node: "n1",
				Labels: map[string]string{"team": fmt.Sprint(i % 3)}, Generation: 1}
		default:
			// Most draws keep the sandbox alive, so that the end of the log
			// still moves views.
			var ok, all []events.Event
			for _, s := range steps {
				e := s.make(gens[i], r)
				to, err := events.Next(phases[i], e.Type())
				if err != nil {
					continue
				}
				all = append(all, e)
				if to.Terminal() || to == events.PhaseDeleting {
					continue
				}
				ok = append(ok, e)
			}
			if len(ok) == 0 || r.IntN(40) == 0 {
				ok = all
			}
			e = ok[r.IntN(len(ok))]
			phase, _ = events.Next(phases[i], e.Type())
			if rr, ok := e.(*events.ResumeRequested); ok {
				gens[i] = rr.Generation
			}
		}
		env, err := events.NewEnvelope(ids[i], e, events.Meta{Actor: "test"}, t0.Add(time.Duration(len(out))*time.Millisecond))
		if err != nil {
			tb.Fatalf("envelope: %v", err)
		}
		env.Phase = phase
		if r.IntN(50) == 0 || phases[i] == events.PhaseDeleted {
			env.Type = "sandbox.from_the_future"
		} else {
			phases[i] = phase
		}
		env.Seq = uint64(len(out) + 1)
		out = append(out, env)
	}
	return out
}

// publishLog stores envs in the event store's stream as jsstore.Append
// would (same subject, body and headers) but pipelined and without the
// concurrency check, so a long log is written quickly. On a fresh stream
// envs land at sequences 1 to len(envs).
func publishLog(tb testing.TB, js jetstream.JetStream, envs []events.Envelope) {
	tb.Helper()
	futures := make([]jetstream.PubAckFuture, 0, len(envs))
	for i, env := range envs {
		body, err := json.Marshal(env)
		if err != nil {
			tb.Fatalf("encode: %v", err)
		}
		msg := &nats.Msg{Subject: jsstore.Subject(env.SandboxID), Data: body, Header: nats.Header{
			jetstream.MsgIDHeader: []string{env.DedupID()},
			jsstore.HeaderType:    []string{env.Type},
		}}
		if i%1000 == 999 {
			// At most a thousand in flight: past nats.go's limit (4000)
			// a publish waits 200 ms for room, then fails, and a host
			// busy with other tests overran that (TestSwapEquivalence).
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				tb.Fatalf("publish: %d acks outstanding after a minute", js.PublishAsyncPending())
			}
		}
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			tb.Fatalf("publish %d: %v", i, err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Sequence != uint64(i+1) {
				tb.Fatalf("event %d stored at %d, want %d (publish to a fresh stream)", i, ack.Sequence, i+1)
			}
		case err := <-f.Err():
			tb.Fatalf("publish %d: %v", i, err)
		}
	}
}

// storeWith is an event store on js whose fresh stream holds envs, at
// sequences 1 to len(envs).
func storeWith(tb testing.TB, js jetstream.JetStream, envs []events.Envelope) *jsstore.Store {
	tb.Helper()
	store, err := jsstore.New(context.Background(), js, jsstore.Config{})
	if err != nil {
		tb.Fatalf("store: %v", err)
	}
	publishLog(tb, js, envs)
	return store
}

// dump is every key of v's bucket and its value.
func dump(tb testing.TB, v *View) map[string]string {
	tb.Helper()
	ctx := context.Background()
	keys, err := v.kv.ListKeys(ctx)
	if err != nil {
		tb.Fatalf("keys of %s: %v", v.cfg.Bucket, err)
	}
	out := map[string]string{}
	for k := range keys.Keys() {
		e, err := v.kv.Get(ctx, k)
		if err != nil {
			tb.Fatalf("get %s: %v", k, err)
		}
		out[k] = string(e.Value())
	}
	return out
}

// sameBucket fails tb unless a and b hold the same keys and values.
func sameBucket(tb testing.TB, a, b *View) {
	tb.Helper()
	da, db := dump(tb, a), dump(tb, b)
	if len(da) != len(db) {
		tb.Errorf("%s holds %d keys, %s %d", a.cfg.Bucket, len(da), b.cfg.Bucket, len(db))
	}
	diffs := 0
	for k, va := range da {
		if vb := db[k]; va != vb && diffs < 5 {
			diffs++
			tb.Errorf("key %s:\n %s: %s\n %s: %s", k, a.cfg.Bucket, va, b.cfg.Bucket, vb)
		}
	}
}

// streamLast is the last sequence of v's bucket stream: how many writes it
// took so far.
func streamLast(tb testing.TB, v *View) uint64 {
	tb.Helper()
	s, err := v.js.Stream(context.Background(), "KV_"+v.cfg.Bucket)
	if err != nil {
		tb.Fatalf("stream of %s: %v", v.cfg.Bucket, err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		tb.Fatalf("stream info of %s: %v", v.cfg.Bucket, err)
	}
	return info.State.LastSeq
}

func newBucket(tb testing.TB, js jetstream.JetStream, bucket string) *View {
	tb.Helper()
	v, err := New(context.Background(), js, Config{Bucket: bucket})
	if err != nil {
		tb.Fatalf("New %s: %v", bucket, err)
	}
	return v
}
