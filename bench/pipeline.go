package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// commander sends lifecycle commands through the real command path. The
// views it returns carry at least the sandbox's id.
type commander interface {
	create(ctx context.Context) (events.View, error)
	do(ctx context.Context, verb, id string) (events.View, error)
}

type busCommander struct{ nc *nats.Conn }

// request sends one command and decodes only what the load needs from the
// answer (the id, or the error): the harness shares the CPU with the service
// it measures, so it spends as little of it as it can.
func (b busCommander) request(ctx context.Context, verb string, body any) (events.View, error) {
	data, _ := json.Marshal(body)
	msg, err := b.nc.RequestWithContext(ctx, "torpor.cmd."+verb, data)
	if err != nil {
		return events.View{}, err
	}
	var answer struct {
		ID    string        `json:"id"`
		Error *events.Error `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &answer); err != nil {
		return events.View{}, err
	}
	if answer.Error != nil {
		return events.View{}, answer.Error
	}
	return events.View{ID: answer.ID}, nil
}

func (b busCommander) create(ctx context.Context) (events.View, error) {
	return b.request(ctx, "create", map[string]string{"driver": "sim"})
}

func (b busCommander) do(ctx context.Context, verb, id string) (events.View, error) {
	return b.request(ctx, verb, map[string]string{"id": id})
}

type httpCommander struct{ c *torpor.Client }

func (h httpCommander) create(ctx context.Context) (events.View, error) {
	return h.c.Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
}

func (h httpCommander) do(ctx context.Context, verb, id string) (events.View, error) {
	return h.c.Lifecycle(ctx, verb, id, false, "")
}

// viewWaiter watches the KV phase view and wakes whoever waits for a
// sandbox to reach a phase: "until the phase view shows each outcome".
type viewWaiter struct {
	mu    sync.Mutex
	waits map[string]*phaseWait
	// seen is the last phase the watch delivered of each sandbox: a
	// sandbox created may reach ready before its wait is registered.
	seen map[string]events.Phase
	kv   jetstream.KeyValue
	w    jetstream.KeyWatcher
}

type phaseWait struct {
	phase events.Phase
	ch    chan events.Phase
}

func newViewWaiter(ctx context.Context, js jetstream.JetStream) (*viewWaiter, error) {
	kv, err := js.KeyValue(ctx, "torpor_phases")
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	vw := &viewWaiter{waits: map[string]*phaseWait{}, seen: map[string]events.Phase{}, kv: kv, w: w}
	go func() {
		defer func() { _ = w.Stop() }()
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var v struct {
				Phase events.Phase `json:"phase"`
			}
			if json.Unmarshal(e.Value(), &v) != nil {
				continue
			}
			vw.mu.Lock()
			vw.seen[e.Key()] = v.Phase
			if pw := vw.waits[e.Key()]; pw != nil && (v.Phase == pw.phase || v.Phase == events.PhaseError) {
				delete(vw.waits, e.Key())
				pw.ch <- v.Phase
			}
			vw.mu.Unlock()
		}
	}()
	return vw, nil
}

// stop ends the watch: a section that does not wait on the view this way
// should not pay for its deliveries.
func (vw *viewWaiter) stop() { _ = vw.w.Stop() }

// seenAt says whether the watch has delivered phase as id's last: a
// sandbox's outcome that came before the wait was registered (a create's,
// whose id is known only once it is answered).
func (vw *viewWaiter) seenAt(id string, phase events.Phase) bool {
	vw.mu.Lock()
	defer vw.mu.Unlock()
	return vw.seen[id] == phase
}

// expect registers interest in id reaching phase; call it before the command.
// One wait per sandbox: a second would take the first one's wake-up, so it is
// refused (the load drives each sandbox from one client at a time).
func (vw *viewWaiter) expect(id string, phase events.Phase) (<-chan events.Phase, error) {
	ch := make(chan events.Phase, 1)
	vw.mu.Lock()
	defer vw.mu.Unlock()
	if pw := vw.waits[id]; pw != nil {
		return nil, fmt.Errorf("sandbox %s: already waited on for %s", id, pw.phase)
	}
	vw.waits[id] = &phaseWait{phase: phase, ch: ch}
	return ch, nil
}

func (vw *viewWaiter) cancel(id string) {
	vw.mu.Lock()
	delete(vw.waits, id)
	vw.mu.Unlock()
}

func (vw *viewWaiter) wait(ctx context.Context, id string, phase events.Phase, ch <-chan events.Phase) error {
	select {
	case got := <-ch:
		if got != phase {
			return fmt.Errorf("sandbox %s went to %s waiting for %s", id, got, phase)
		}
		return nil
	case <-ctx.Done():
		vw.cancel(id)
		return fmt.Errorf("sandbox %s: no %s in the view: %w", id, phase, ctx.Err())
	}
}

// step sends verb to id and waits until the view shows target.
func step(ctx context.Context, cmd commander, vw *viewWaiter, verb, id string, target events.Phase) error {
	ch, err := vw.expect(id, target)
	if err != nil {
		return err
	}
	if _, err := cmd.do(ctx, verb, id); err != nil {
		vw.cancel(id)
		return fmt.Errorf("%s %s: %w", verb, id, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return vw.wait(wctx, id, target, ch)
}

// createReady creates n sandboxes with c clients and waits until all are ready.
func createReady(ctx context.Context, cmd commander, vw *viewWaiter, n, c int) ([]string, float64, error) {
	return createReadyOn(ctx, func(int) (commander, *viewWaiter) { return cmd, vw }, n, c)
}

// createReadyOn is createReady with sandbox i created through on(i)'s
// commander and waited for on its view.
func createReadyOn(ctx context.Context, on func(i int) (commander, *viewWaiter), n, c int) ([]string, float64, error) {
	ids := make([]string, n)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
	)
	start := time.Now()
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				cmd, vw := on(i)
				if err := createOne(ctx, cmd, vw, ids, i); err != nil {
					mu.Lock()
					ferr = errors.Join(ferr, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return ids, float64(n) / time.Since(start).Seconds(), ferr
}

func createOne(ctx context.Context, cmd commander, vw *viewWaiter, ids []string, i int) error {
	v, err := cmd.create(ctx)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	ids[i] = v.ID
	ch, err := vw.expect(v.ID, events.PhaseReady)
	if err != nil {
		return err
	}
	// The attach may have been projected before we registered: the watch
	// may have delivered it already, or the bucket may have it (a read that
	// on a cluster may come from a replica behind the watch).
	if vw.seenAt(v.ID, events.PhaseReady) {
		vw.cancel(v.ID)
		return nil
	}
	if e, err := vw.kv.Get(ctx, v.ID); err == nil {
		var cur events.View
		if json.Unmarshal(e.Value(), &cur) == nil && cur.Phase == events.PhaseReady {
			vw.cancel(v.ID)
			return nil
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return vw.wait(wctx, v.ID, events.PhaseReady, ch)
}

// Pipeline is the full command path under load.
type Pipeline struct {
	Transport   string  `json:"transport"`
	Sandboxes   int     `json:"sandboxes"`
	Concurrency int     `json:"concurrency"`
	Seconds     float64 `json:"seconds"`
	Transitions int64   `json:"transitions"`
	Events      uint64  `json:"events"`
	// ViewWrites counts the writes to the KV view meanwhile (views and
	// checkpoints): how much the projection coalesced.
	ViewWrites        uint64  `json:"view_writes"`
	TransitionsPerS   float64 `json:"transitions_per_s"`
	EventsPerS        float64 `json:"events_per_s"`
	CreateToReadyPerS float64 `json:"create_to_ready_per_s"`
	// P50, P90 and P99 time the closed loop's transitions, from sending
	// the command to the view showing its outcome, in milliseconds.
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	// CPUMsPerTransition is this process's CPU time (service, embedded
	// server and the bench's clients) per transition, and CoresBusy the
	// share of the cores it kept busy.
	CPUMsPerTransition float64 `json:"cpu_ms_per_transition"`
	CoresBusy          float64 `json:"cores_busy"`
	// ServerMsgsPerEvent counts the messages the server took in and sent
	// out per event appended; a raw append is two, the publish and its ack.
	ServerMsgsPerEvent float64 `json:"server_msgs_per_event"`
	// Host is what the host probe saw meanwhile (nil where it cannot run).
	Host *Host `json:"host,omitempty"`
}

// stepFunc sends verb to sandbox id and returns once its outcome, the
// phase target, is visible to the client.
type stepFunc func(ctx context.Context, verb, id string, target events.Phase) error

// move is one command of the load and the phase that is its outcome.
type move struct {
	verb   string
	target events.Phase
}

// suspendResume is the cycle every load drives a sandbox through: suspend
// → suspended, then resume → ready.
var suspendResume = []move{{"suspend", events.PhaseSuspended}, {"resume", events.PhaseReady}}

// viewStep is step through cmd and the bench's own watch of the view.
func viewStep(cmd commander, vw *viewWaiter) stepFunc {
	return func(ctx context.Context, verb, id string, target events.Phase) error {
		return step(ctx, cmd, vw, verb, id, target)
	}
}

// closed is what a closed loop measured: the transitions made, the seconds
// it ran, and the latency of each transition.
type closed struct {
	transitions int64
	secs        float64
	lats        []time.Duration
}

// cycle runs c clients, each cycling its share of ids through suspend →
// suspended → resume → ready with step, for d; a transition counts, and is
// timed, once step returns.
func cycle(ctx context.Context, step stepFunc, ids []string, c int, d time.Duration) (closed, error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
		res  closed
	)
	until := time.Now().Add(d)
	start := time.Now()
	for w := 0; w < c; w++ {
		mine := share(ids, w, c)
		if len(mine) == 0 {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each client keeps its own latencies: a lock per transition
			// would be load the service does not have.
			var lats []time.Duration
			defer func() {
				mu.Lock()
				res.lats = append(res.lats, lats...)
				mu.Unlock()
			}()
			for k := 0; time.Now().Before(until); k++ {
				id := mine[k%len(mine)]
				for _, mv := range suspendResume {
					t0 := time.Now()
					if err := step(ctx, mv.verb, id, mv.target); err != nil {
						mu.Lock()
						ferr = errors.Join(ferr, err)
						mu.Unlock()
						return
					}
					lats = append(lats, time.Since(t0))
				}
			}
		}()
	}
	wg.Wait()
	res.secs = time.Since(start).Seconds()
	res.transitions = int64(len(res.lats))
	return res, ferr
}

// share is client w's part of ids when c clients split them: the ids at w,
// w+c, w+2c, … Two clients on one sandbox would race each other's commands
// and waits, so the parts are disjoint.
func share(ids []string, w, c int) []string {
	var mine []string
	for k := w; k < len(ids); k += c {
		mine = append(mine, ids[k])
	}
	return mine
}
