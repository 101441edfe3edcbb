package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute/sim"
)

// TestRandomizedRunWithKills: sandboxes with random sim faults, random
// commands from several clients (some with idempotency keys, retried as a
// client retries when the service is gone), and the service killed with
// SIGKILL three times and started again on its data directory meanwhile;
// then quiescence (no sandbox left in a transient phase) and not one
// violation of the invariants (`torpor check`), nor an effect of the driver
// twice. Seeded: TORPOR_SEED repeats a run; it prints its seed and figures.
func TestRandomizedRunWithKills(t *testing.T) {
	if testing.Short() {
		t.Skip("the randomized run takes about a minute; -short leaves it out")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TORPOR_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("TORPOR_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (TORPOR_SEED=%d repeats this run)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 1))
	const (
		sandboxes = 30
		clients   = 4
		kills     = 3
		load      = 30 * time.Second
		deadline  = 3 * time.Second
	)
	dir := t.TempDir()
	var cur atomic.Pointer[child]
	cur.Store(serveProcess(t, dir, "--deadline", deadline.String()))
	client := func() *torpor.Client { return cur.Load().client() }

	// retry sends a command until the service answers it (it may be down
	// for a kill): with a key, the same key, as a client's retry would.
	retry := func(ctx context.Context, do func(c *torpor.Client) error) error {
		for {
			err := do(client())
			if events.CodeOf(err) != events.CodeUnavailable || ctx.Err() != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ctx := context.Background()
	ids := make([]string, sandboxes)
	for i := range ids {
		opts := faults(r)
		key := fmt.Sprintf("create-%d", i)
		err := retry(ctx, func(c *torpor.Client) error {
			v, err := c.Create(ctx, torpor.CreateRequest{Driver: "sim", DriverOptions: opts}, key)
			ids[i] = v.ID
			return err
		})
		if err != nil {
			t.Fatalf("create %d with %v: %v", i, opts, err)
		}
	}

	var (
		mu        sync.Mutex
		answered  = map[string]int{} // by code ("" for accepted)
		wg        sync.WaitGroup
		loadCtx   context.Context
		cancel    context.CancelFunc
		verbs     = []string{"suspend", "resume", "resume", "stop", "start", "suspend"}
		clientRNG = make([]*rand.Rand, clients)
	)
	for i := range clientRNG {
		clientRNG[i] = rand.New(rand.NewPCG(seed, uint64(i+2)))
	}
	loadCtx, cancel = context.WithTimeout(ctx, load)
	defer cancel()
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func(r *rand.Rand) {
			defer wg.Done()
			for n := 0; loadCtx.Err() == nil; n++ {
				id := ids[r.IntN(len(ids))]
				verb := verbs[r.IntN(len(verbs))]
				if r.IntN(250) == 0 {
					verb = "delete"
				}
				key := ""
				if r.IntN(2) == 0 {
					key = fmt.Sprintf("%d-%d-%s", r.Uint64(), n, verb)
				}
				fallback := verb == "resume" && r.IntN(2) == 0
				err := retry(loadCtx, func(c *torpor.Client) error {
					var err error
					if verb == "delete" {
						_, err = c.Delete(loadCtx, id, key)
					} else {
						_, err = c.Lifecycle(loadCtx, verb, id, fallback, key)
					}
					return err
				})
				if loadCtx.Err() != nil {
					return
				}
				mu.Lock()
				answered[string(events.CodeOf(err))]++
				mu.Unlock()
				time.Sleep(time.Duration(r.IntN(200)) * time.Millisecond)
			}
		}(clientRNG[w])
	}
	// Kill the service at random moments of the load, and start it again.
	for k := 0; k < kills; k++ {
		time.Sleep(time.Duration(3000+r.IntN(5000)) * time.Millisecond)
		cur.Load().kill()
		cur.Store(serveProcess(t, dir, "--deadline", deadline.String()))
	}
	wg.Wait()

	// Quiescence: every sandbox settles within its deadlines.
	end := time.Now().Add(6*deadline + 20*time.Second)
	var moving []string
	for {
		moving = moving[:0]
		for _, id := range ids {
			v, err := client().Get(ctx, id)
			if err != nil || v.Phase.Transient() {
				moving = append(moving, fmt.Sprintf("%s %s %v", id, v.Phase, err))
			}
		}
		if len(moving) == 0 || time.Now().After(end) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(moving) > 0 {
		t.Errorf("not settled after the load: %v", moving)
	}
	check := exec.Command(binary(t), "check", "--server", "http://"+cur.Load().http, "--deadline", deadline.String())
	check.Env = append(os.Environ(), tokenEnv(cur.Load().http)...)
	out, err := check.CombinedOutput()
	violations := "0"
	if err != nil {
		violations = "some"
		t.Errorf("torpor check: %v\n%s", err, out)
	}
	effects, err := sim.Effects(dir)
	if err != nil {
		t.Fatal(err)
	}
	twice := 0
	for e, n := range effects {
		if n != 1 {
			twice++
			t.Errorf("effect %+v happened %d times", e, n)
		}
	}
	phases := map[events.Phase]int{}
	for _, id := range ids {
		v, _ := client().Get(ctx, id)
		phases[v.Phase]++
	}
	accepted := answered[""]
	total := 0
	for _, n := range answered {
		total += n
	}
	t.Logf("seed %d: %d sandboxes, %d commands answered, %d accepted, refused by code %v; %d kills; %d driver effects, %d twice; ended in %v; violations: %s",
		seed, sandboxes, total, accepted, answered, kills, len(effects), twice, phases, violations)
	if accepted < 50 {
		t.Errorf("only %d commands accepted: the run did not exercise the service", accepted)
	}
	// Every refusal has a contract code that says why; none is an
	// internal error.
	if n := answered[string(events.CodeInternal)]; n > 0 {
		t.Errorf("%d commands answered INTERNAL", n)
	}
}

// faults draws a sandbox's sim options: the faults of CONTRACT §8 at
// random, most sandboxes with a few, some with none.
func faults(r *rand.Rand) map[string]string {
	o := map[string]string{}
	pick := func(p int, k string, vs ...string) {
		if r.IntN(100) < p {
			o[k] = vs[r.IntN(len(vs))]
		}
	}
	pick(40, "suspend", "reject", "hang", "ok", "unimplemented")
	pick(50, "resume", "fail", "fail_once", "fail_after_consume")
	pick(10, "exit_during_suspend", "0", "9", "137")
	pick(10, "exit_after", "4s", "9s")
	pick(30, "latency", "5ms", "20ms", "60ms")
	pick(20, "answer_delay", "10ms", "50ms")
	pick(5, "attach", "never")
	return o
}
