package bench

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
)

// TestShareIsDisjoint checks that the closed loop's clients split the
// sandboxes without overlap, also when the count is not a multiple of the
// clients: two clients cycling one sandbox wait on each other's outcomes.
func TestShareIsDisjoint(t *testing.T) {
	for _, tc := range []struct{ n, c int }{{1000, 64}, {20, 4}, {22, 4}, {3, 8}, {1, 1}} {
		ids := make([]string, tc.n)
		for i := range ids {
			ids[i] = fmt.Sprint(i)
		}
		seen := map[string]int{}
		for w := 0; w < tc.c; w++ {
			for _, id := range share(ids, w, tc.c) {
				seen[id]++
			}
		}
		if len(seen) != tc.n {
			t.Errorf("n=%d c=%d: %d sandboxes shared out, want all %d", tc.n, tc.c, len(seen), tc.n)
		}
		for id, k := range seen {
			if k != 1 {
				t.Errorf("n=%d c=%d: sandbox %s given to %d clients", tc.n, tc.c, id, k)
			}
		}
	}
}

// TestOneWaitPerSandbox checks that the view waiter refuses a second wait on
// a sandbox, which would steal the first one's wake-up.
func TestOneWaitPerSandbox(t *testing.T) {
	vw := &viewWaiter{waits: map[string]*phaseWait{}}
	if _, err := vw.expect("a", events.PhaseSuspended); err != nil {
		t.Fatal(err)
	}
	if _, err := vw.expect("a", events.PhaseReady); err == nil {
		t.Fatal("a second wait on one sandbox was accepted")
	}
	vw.cancel("a")
	if _, err := vw.expect("a", events.PhaseReady); err != nil {
		t.Fatalf("after cancel: %v", err)
	}
}

// TestMixAlternates checks that the open loop offers suspends and resumes in
// turn, as the closed loop runs them, rather than in waves of one kind: from
// all ready, with commands that finish at once, the verbs alternate after
// the first suspend; with none finishing, each tick takes what is idle, and
// a tick with nothing idle is refused.
func TestMixAlternates(t *testing.T) {
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprint(i)
	}
	verb := func(suspended bool) string {
		if suspended {
			return "resume"
		}
		return "suspend"
	}

	m := newMix(ids)
	var got []string
	for k := range 8 {
		id, suspended, ok := m.take(k)
		if !ok {
			t.Fatalf("tick %d: nothing idle, with every command finished", k)
		}
		got = append(got, verb(suspended))
		m.done(id, !suspended)
	}
	// Tick 1 wants a resume; the first suspend has finished, so one is idle.
	want := "suspend resume suspend resume suspend resume suspend resume"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("finishing at once: got %s, want %s", g, want)
	}

	m = newMix(ids[:3])
	got = got[:0]
	for k := range 4 {
		_, suspended, ok := m.take(k)
		if !ok {
			got = append(got, "skip")
			continue
		}
		got = append(got, verb(suspended))
	}
	want = "suspend suspend suspend skip"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("none finishing: got %s, want %s", g, want)
	}

	// A sandbox goes back idle in the phase its command left it in.
	m = newMix(ids[:1])
	id, _, _ := m.take(0)
	m.done(id, true)
	if id2, suspended, ok := m.take(0); !ok || id2 != id || !suspended {
		t.Errorf("after a suspend: took %q suspended=%v ok=%v, want %q suspended", id2, suspended, ok, id)
	}
}

// TestOfferSendsEveryCommandDue checks that the open loop's schedule sends
// each of rate × d commands once, in order, whether or not it keeps up: a
// send that takes longer than the interval does not drop the ones that
// came due meanwhile. Skips are counted.
func TestOfferSendsEveryCommandDue(t *testing.T) {
	for _, tc := range []struct {
		name string
		slow time.Duration
	}{{"keeping up", 0}, {"late", 3 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			offered, skipped, err := offer(context.Background(), 2000, 20*time.Millisecond, func(k int) bool {
				got = append(got, k)
				time.Sleep(tc.slow)
				return k%4 != 3
			})
			if err != nil {
				t.Fatal(err)
			}
			if offered != 40 || len(got) != 40 {
				t.Fatalf("offered %d, sent %d; want 40 (2000/s for 20ms)", offered, len(got))
			}
			for i, k := range got {
				if k != i {
					t.Fatalf("command %d sent as %d; want each once, in order", i, k)
				}
			}
			if skipped != 10 {
				t.Errorf("skipped %d, want 10", skipped)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := offer(ctx, 10, time.Second, func(int) bool { return true }); err == nil {
		t.Error("a cancelled offer returned no error")
	}
}

// TestJudgeHost checks how the host probe's chunk times become a verdict:
// a chunk five times its usual time or more is slow and stands for one
// probe interval, consecutive slow chunks are one episode, and the worst
// chunk is reported as a multiple.
func TestJudgeHost(t *testing.T) {
	us := time.Microsecond
	ds := []time.Duration{100 * us, 120 * us, 600 * us, 1400 * us, 90 * us, 499 * us, 500 * us, 100 * us}
	got := judge(ds, 100*us)
	want := Host{Chunks: 8, ChunkUS: 100, SlowChunks: 3, SlowMS: 15, Episodes: 2, WorstX: 14}
	if *got != want {
		t.Errorf("judge: got %+v, want %+v", *got, want)
	}
	if got := judge(nil, 100*us); got.Chunks != 0 || got.SlowChunks != 0 || got.Episodes != 0 {
		t.Errorf("judge of no chunks: %+v", *got)
	}
}

// TestConfigValidate checks that every setting the bench cannot run with is
// refused, naming the flag of `torpor bench` that sets it, and that the
// zero growth settings take their defaults.
func TestConfigValidate(t *testing.T) {
	good := Config{Sandboxes: 20, Concurrency: 4, Transport: "bus", Duration: time.Second}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no sandboxes", func(c *Config) { c.Sandboxes = 0 }, "--sandboxes"},
		{"no clients", func(c *Config) { c.Concurrency = 0 }, "--concurrency"},
		{"more clients than sandboxes", func(c *Config) { c.Sandboxes, c.Concurrency = 4, 8 }, "--concurrency 8 above --sandboxes 4"},
		{"fsync", func(c *Config) { c.Fsync = "sometimes" }, "--fsync"},
		{"transport", func(c *Config) { c.Transport = "carrier-pigeon" }, "--transport"},
		{"no duration", func(c *Config) { c.Duration = 0 }, "--duration"},
		{"negative runs", func(c *Config) { c.Runs = -1 }, "--runs"},
		{"negative rate", func(c *Config) { c.Rate = -5 }, "--rate"},
		{"NaN rate", func(c *Config) { c.Rate = math.NaN() }, "--rate"},
		{"infinite rate", func(c *Config) { c.Rate = math.Inf(1) }, "--rate"},
		{"shrinking sizes", func(c *Config) { c.Sizes = []int{300, 100} }, "growth sizes"},
		{"empty size", func(c *Config) { c.Sizes = []int{0, 100} }, "growth sizes"},
		{"negative sample", func(c *Config) { c.Sample = -1 }, "growth"},
	} {
		c := good
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	d := good.withDefaults()
	if len(d.Sizes) != 3 || d.ShortHistory != 10 || d.LongHistory != 1000 || d.LongSample != 100 || d.Sample != 200 {
		t.Errorf("defaults: %+v", d)
	}
	q := Config{Sandboxes: 1000, Concurrency: 64, Quick: true, Transport: "bus", Duration: 10 * time.Second, Sizes: []int{100, 300}}.withDefaults()
	if q.Sandboxes != 200 || q.Concurrency != 16 || q.Duration != 3*time.Second || !slices.Equal(q.Sizes, []int{100, 300}) || q.LongHistory != 200 {
		t.Errorf("quick defaults: %+v; want sizes capped and the sizes set kept", q)
	}
	if q := (Config{Quick: true, Duration: 10 * time.Second, Runs: 3}).withDefaults(); q.Duration != time.Second {
		t.Errorf("quick with 3 runs: %s a run, want 1s (3 s of each figure in all)", q.Duration)
	}
}

// TestHTTPCeiling: the closed loop over HTTP pays one bare round trip (the
// command with ?wait=true) where the bus's pays one request; with a
// transition over the bus at 0.4 ms CPU, an HTTP round trip at 60 µs and a
// bus request at 20 µs, one over HTTP costs at least 0.4 − 0.02 + 0.06 =
// 0.44 ms: per CPU second, 10/11 of the bus's transitions.
func TestHTTPCeiling(t *testing.T) {
	h, b := RoundTrip{CPUMicros: 60}, RoundTrip{CPUMicros: 20}
	if got := httpCeiling(0.4, h, b); math.Abs(got-10.0/11) > 1e-9 {
		t.Errorf("ceiling = %v, want 10/11", got)
	}
	// Without a figure there is no ceiling, rather than one of 1.
	for _, tc := range []struct {
		ms   float64
		h, b RoundTrip
	}{{0, h, b}, {0.4, RoundTrip{}, b}, {0.4, h, RoundTrip{}}} {
		if got := httpCeiling(tc.ms, tc.h, tc.b); got != 0 {
			t.Errorf("ceiling(%v, %+v, %+v) = %v, want 0 (not measured)", tc.ms, tc.h, tc.b, got)
		}
	}
}

// TestHTTPRoundTrip runs the bare HTTP round trip: each client's requests are
// answered with the whole reply, and counted.
func TestHTTPRoundTrip(t *testing.T) {
	rt, err := httpRoundTrip(context.Background(), 3, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Concurrency != 3 || !(rt.PerS > 0) || (runtime.GOOS == "linux" && !(rt.CPUMicros > 0)) {
		t.Errorf("round trip %+v, want 3 clients' measured figures", rt)
	}
}
