package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Latency is command-to-visible latency at a fixed offered rate.
type Latency struct {
	OfferedPerS float64 `json:"offered_per_s"`
	// Offered counts the commands that came due; each was sent or, when
	// no sandbox was idle, Skipped.
	Offered      int     `json:"offered,omitempty"`
	AchievedPerS float64 `json:"achieved_per_s"`
	Skipped      int     `json:"skipped"`
	Percentiles
	// CPUMsPerTransition and CoresBusy: as in Pipeline, at this
	// offered rate.
	CPUMsPerTransition float64 `json:"cpu_ms_per_transition,omitempty"`
	CoresBusy          float64 `json:"cores_busy,omitempty"`
	// Host is what the host probe saw meanwhile (nil where it cannot run).
	Host *Host `json:"host,omitempty"`
	// ByVerb splits the samples by command: a suspend's path to its outcome
	// is about eight hops, a resume's has three appends and the
	// supervisor's report more.
	ByVerb map[string]*Latency `json:"by_verb,omitempty"`
}

// openLoop offers rate commands per second for d, each on an idle sandbox,
// and measures from sending the command to the view showing its outcome.
// Suspends and resumes alternate, as they do in the closed loop (see mix),
// which hands out the idle sandboxes and holds them, as each run leaves
// them, for the next. A command that comes due when no sandbox is idle is
// skipped and counted.
func openLoop(ctx context.Context, cmd commander, vw *viewWaiter, m *mix, rate float64, d time.Duration) (Latency, error) {
	res := Latency{OfferedPerS: rate}
	if rate <= 0 || math.IsInf(rate, 0) || math.IsNaN(rate) {
		return res, fmt.Errorf("latency: no rate to offer (%v)", rate)
	}
	var (
		mu     sync.Mutex
		lats   []time.Duration
		byVerb = map[string][]time.Duration{}
		ferr   error
		wg     sync.WaitGroup
	)
	start := time.Now()
	offered, skipped, oerr := offer(ctx, rate, d, func(k int) bool {
		id, suspended, ok := m.take(k)
		if !ok {
			return false
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mv := suspendResume[0]
			if suspended {
				mv = suspendResume[1]
			}
			t0 := time.Now()
			err := step(ctx, cmd, vw, mv.verb, id, mv.target)
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				ferr = errors.Join(ferr, err)
				return
			}
			lats = append(lats, lat)
			byVerb[mv.verb] = append(byVerb[mv.verb], lat)
			m.done(id, !suspended)
		}()
		return true
	})
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	res.Offered, res.Skipped = offered, skipped
	if oerr != nil {
		return res, oerr
	}
	res.AchievedPerS = float64(len(lats)) / elapsed
	res.Percentiles = percentilesOf(lats)
	res.ByVerb = map[string]*Latency{}
	for verb, ls := range byVerb {
		res.ByVerb[verb] = &Latency{Percentiles: percentilesOf(ls)}
	}
	return res, ferr
}

// mix hands the open loop its idle sandboxes so that suspends and resumes
// alternate: command k asks for a ready sandbox to suspend when k is even and a
// suspended one to resume when k is odd, and takes the other kind when none
// of the wanted kind is idle. The closed loop runs the two commands half and
// half at every moment; taking the sandboxes in the order they went idle
// instead would, from all ready, run waves of a thousand suspends and then a
// thousand resumes, and a resume costs about twice a suspend, so the load
// would swing around its mean and the tail would measure the swings.
type mix struct {
	ready, suspended chan string
}

func newMix(ids []string) *mix {
	m := &mix{ready: make(chan string, len(ids)), suspended: make(chan string, len(ids))}
	for _, id := range ids {
		m.ready <- id
	}
	return m
}

// take returns an idle sandbox for command k and whether it is suspended; ok is
// false when none is idle.
func (m *mix) take(k int) (id string, suspended, ok bool) {
	want, other := m.ready, m.suspended
	if k%2 == 1 {
		want, other = other, want
	}
	select {
	case id = <-want:
	default:
		select {
		case id = <-other:
		default:
			return "", false, false
		}
		want = other
	}
	return id, want == m.suspended, true
}

// done puts id back among the idle, suspended or ready as its command left
// it.
func (m *mix) done(id string, suspended bool) {
	if suspended {
		m.suspended <- id
		return
	}
	m.ready <- id
}

// offer calls send for the k-th of rate × d commands at k/rate after the
// start. Commands that came due while it was late go at once: a ticker
// would drop them, and the load would fall below the offer just when the
// service is busiest. send reports false when it had nothing to send on;
// offer returns how many came due and how many of those send skipped.
func offer(ctx context.Context, rate float64, d time.Duration, send func(k int) bool) (offered, skipped int, err error) {
	n := int(math.Ceil(d.Seconds() * rate))
	start := time.Now()
	for k := range n {
		if wait := time.Until(start.Add(time.Duration(float64(k) / rate * float64(time.Second)))); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return offered, skipped, ctx.Err()
			}
		}
		offered++
		if !send(k) {
			skipped++
		}
	}
	return offered, skipped, nil
}

// Percentiles of a set of durations, in milliseconds.
type Percentiles struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50"`
	P90     float64 `json:"p90"`
	P99     float64 `json:"p99"`
	Max     float64 `json:"max"`
}

// percentilesOf is the Percentiles of ds, which it sorts.
func percentilesOf(ds []time.Duration) Percentiles {
	p := Percentiles{Samples: len(ds)}
	p.P50, p.P90, p.P99, p.Max = percentiles(ds)
	return p
}

// percentiles returns p50, p90, p99 and max in milliseconds.
func percentiles(ds []time.Duration) (p50, p90, p99, mx float64) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(ds)))) - 1
		return ms(ds[max(0, min(i, len(ds)-1))])
	}
	return at(0.50), at(0.90), at(0.99), ms(ds[len(ds)-1])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// The p99 target is judged at an offered rate that keeps the cores at most
// busyTarget busy: a latency promised at a load that leaves the machine
// half idle. A transition costs more CPU the fewer run at once, so the rate
// is measured, not computed: short calibration runs, at most
// maxCalibrations, each correcting the rate by how far its share of busy
// cores was from busyAim, until one lands between busyTarget less
// busyTolerance and busyTarget (45–50%). Aiming at the middle of that band
// keeps a run's noise from carrying the judged run past half busy.
const (
	busyTarget      = 0.5
	busyTolerance   = 0.1 // relative
	busyAim         = busyTarget * (1 - busyTolerance/2)
	maxCalibrations = 3
)

// settled reports whether a run that kept the cores busy busy is in the
// band the p99 target's run must be in.
func settled(busy float64) bool {
	return busy >= busyTarget*(1-busyTolerance) && busy <= busyTarget
}

// Busy is the open loop at the rate that keeps the cores about half busy,
// which the p99 target is judged on, with what the host probe saw during it
// and the calibration runs that found the rate.
type Busy struct {
	Latency
	Calibration []Calibration `json:"calibration"`
	// Capped says the rate was held at half the closed loop's: the cores
	// would not get half busy below it (the log's syncs bound the rate,
	// as with --fsync always), and a load past half the capacity is no
	// longer the half-idle machine the figure promises.
	Capped bool `json:"capped_at_half_capacity,omitempty"`
}

// Calibration is one short run of the search for Busy's rate.
type Calibration struct {
	OfferedPerS        float64 `json:"offered_per_s"`
	Samples            int     `json:"samples"`
	CPUMsPerTransition float64 `json:"cpu_ms_per_transition"`
	CoresBusy          float64 `json:"cores_busy"`
}

// opener runs open loops on one service and says what each cost.
type opener struct {
	cmd commander
	vw  *viewWaiter
	mix *mix
	ns  *server.Server
}

// run is openLoop at rate for d, with its cost and the host probe's verdict.
func (o opener) run(ctx context.Context, rate float64, d time.Duration) (Latency, error) {
	var l Latency
	stopProbe := probeHost()
	c, err := costOf(o.ns, func() (int, error) {
		var lerr error
		l, lerr = openLoop(ctx, o.cmd, o.vw, o.mix, rate, d)
		return l.Samples, lerr
	})
	l.Host = stopProbe()
	l.CPUMsPerTransition, l.CoresBusy = c.msPerTransition, c.coresBusy
	return l, err
}

// halfBusy finds an offered rate that keeps the cores about half busy and
// measures the latency there for d. It starts from a run that offered from
// per second and kept the share busy of the cores busy, calibrates with
// runs of calib, and never offers more than half of capacity (the closed
// loop's rate): half busy means half the capacity left free, whatever
// bounds it, the cores or the log's syncs. (It offered up to the whole
// closed loop's rate before; with the syncs shared by group commit the
// cores stayed under half busy there and commands queued: a p50 of 860 ms.)
func (o opener) halfBusy(ctx context.Context, from, busy, capacity float64, calib, d time.Duration) (*Busy, error) {
	return halfBusy(ctx, o.run, from, busy, capacity, calib, d)
}

// halfBusy is opener.halfBusy with the open loop's run given.
func halfBusy(ctx context.Context, run func(context.Context, float64, time.Duration) (Latency, error), from, busy, capacity float64, calib, d time.Duration) (*Busy, error) {
	if busy <= 0 {
		return nil, errors.New("latency at half busy: no CPU time measured")
	}
	b := &Busy{}
	most := capacity / 2
	rate := min(from*busyAim/busy, most)
	for range maxCalibrations {
		l, err := run(ctx, rate, calib)
		if err != nil {
			return nil, fmt.Errorf("calibration at %.0f/s: %w", rate, err)
		}
		b.Calibration = append(b.Calibration, Calibration{OfferedPerS: rate, Samples: l.Samples, CPUMsPerTransition: l.CPUMsPerTransition, CoresBusy: l.CoresBusy})
		if l.CoresBusy <= 0 {
			return nil, errors.New("latency at half busy: no CPU time measured")
		}
		if settled(l.CoresBusy) {
			break
		}
		next := min(rate*busyAim/l.CoresBusy, most)
		if next == rate {
			break // at most already, and the cores less busy than the target
		}
		rate = next
	}
	l, err := run(ctx, rate, d)
	b.Latency = l
	b.Capped = rate == most && !settled(l.CoresBusy)
	return b, err
}
