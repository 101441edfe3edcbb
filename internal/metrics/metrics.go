// Package metrics is torpor's Prometheus instrumentation: one Set owns a
// registry and every collector, and the packages that record into it see
// only its methods. A nil *Set records nothing, so a part built without
// one (a test, a rebuild's view) costs a nil check per observation.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric of the Set.
const Namespace = "torpor"

// OK is the code of a command or a driver call that succeeded.
const OK = "OK"

// scrapeTimeout bounds what a scrape-time collector (phases, lags) waits
// for its answer.
const scrapeTimeout = 5 * time.Second

// Buckets of the latency histograms, in seconds: a command or a sim driver
// call takes well under a millisecond to a few, a process or vm driver call
// up to seconds, a saga step up to the phase deadline (2m by default).
var (
	commandBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	stepBuckets    = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
)

// Set is the service's metrics. Its methods are safe for concurrent use and
// do nothing on a nil *Set.
type Set struct {
	reg *prometheus.Registry

	commands    *observers
	steps       *observers
	driverCalls *observers
	transitions *counters
	deadlines   *counters
	fenced      *counters
	parked      *prometheus.CounterVec
	foreign     prometheus.Counter
	conflicts   prometheus.Counter
	retries     prometheus.Counter
	extended    *prometheus.CounterVec
	// expirations counts the expiries recorded (issue 27).
	expirations *counters
	// wakes and wakeLatency are the wakes on traffic (issue 27).
	wakes       *counters
	wakeLatency prometheus.Observer
	activity    *counters
	// idles counts the idle timeouts recorded (issue 27).
	idles *counters
	// resumeStages is resume latency by stage (issue 29, resume.go).
	resumeStages *observers
}

// New returns a Set with its collectors registered, the Go runtime's and
// the process's among them.
func New() *Set {
	s := &Set{reg: prometheus.NewRegistry()}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.commands = newObservers(s.reg, prometheus.HistogramOpts{
		Name: "command_duration_seconds", Help: "Time to handle a lifecycle command (HTTP and bus alike), by verb and contract code (OK on success).",
		Buckets: commandBuckets,
	}, "verb", "code")
	s.steps = newObservers(s.reg, prometheus.HistogramOpts{
		Name: "saga_step_duration_seconds", Help: "Time a saga step took, by saga, step and outcome.",
		Buckets: stepBuckets,
	}, "saga", "step", "outcome")
	s.driverCalls = newObservers(s.reg, prometheus.HistogramOpts{
		Name: "driver_call_duration_seconds", Help: "Time a driver call took, by driver, operation and contract code (OK on success).",
		Buckets: stepBuckets,
	}, "driver", "op", "code")
	s.transitions = newCounters(s.reg, prometheus.CounterOpts{
		Name: "transitions_total", Help: "Phase changes the live phase view folded in, by the phase left (none for a create) and the phase entered.",
	}, "from", "to")
	s.deadlines = newCounters(s.reg, prometheus.CounterOpts{
		Name: "deadline_firings_total", Help: "Deadlines of transient phases that passed and were settled, by the phase.",
	}, "phase")
	s.fenced = newCounters(s.reg, prometheus.CounterOpts{
		Name: "fenced_reports_total", Help: "Supervisor reports ignored, by why: credential (not the one minted for the generation it claims) or generation (not the current one).",
	}, "reason")
	s.activity = newCounters(s.reg, prometheus.CounterOpts{
		Name: "activity_total", Help: "Activity events (sandbox.active) appended, by source: touch, forward or supervisor (README \"Activity\").",
	}, "source")
	s.parked = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "parked_events_total", Help: "Events a view can never apply, parked and skipped, by view.",
	}, []string{"view"})
	s.foreign = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "foreign_messages_total", Help: "Messages on sandbox subjects that are no torpor event, skipped by the readers (each counted once).",
	})
	s.conflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "append_conflicts_total", Help: "Appends refused because the sandbox's subject moved past the expected sequence.",
	})
	s.retries = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "append_retries_total", Help: "Appends the gateway decided again and retried after a conflict.",
	})
	s.extended = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "outage_extensions_total", Help: "Deadlines (what=deadline) and heartbeat limits (what=heartbeat) extended because the log was unavailable within them (a NATS election, a server down).",
	}, []string{"what"})
	s.reg.MustRegister(s.parked, s.foreign, s.conflicts, s.retries, s.extended)
	s.expirations = newCounters(s.reg, prometheus.CounterOpts{
		Name: "expirations_total", Help: "Expiries the sagas recorded, by reason: ttl (a sandbox's time to live) or retention (a retained state held past its retain_for).",
	}, "reason")
	s.wakes = newCounters(s.reg, prometheus.CounterOpts{
		Name: "wakes_total", Help: "Connections to a forward of a suspended sandbox with wake_on_traffic, by outcome: woken (carried to the resumed sandbox), failed (its resume failed), timeout (not ready within serve --wake-timeout), limit (refused at once: too many held already).",
	}, "outcome")
	wl := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "wake_seconds", Help: "Wake latency: from a connection accepted on a forward of a suspended sandbox with wake_on_traffic to its first byte forwarded to the resumed sandbox.",
		Buckets: stepBuckets,
	})
	s.reg.MustRegister(wl)
	s.wakeLatency = wl
	s.idles = newCounters(s.reg, prometheus.CounterOpts{
		Name: "idle_timeouts_total", Help: "Idle timeouts recorded (a ready sandbox with no activity for its idle policy's after), by the action started: suspend or stop.",
	}, "action")
	s.resumeStages = newResumeStages(s.reg)
	return s
}

// Wake counts a connection held for a wake on traffic, by its outcome
// (woken, failed, timeout, limit).
func (s *Set) Wake(outcome string) {
	if s != nil {
		s.wakes.get(labels{outcome}).Inc()
	}
}

// WakeLatency observes a wake's latency: a connection accepted on a
// forward of a suspended sandbox to its first byte forwarded.
func (s *Set) WakeLatency(d time.Duration) {
	if s != nil {
		s.wakeLatency.Observe(d.Seconds())
	}
}

// IdleTimeout counts an idle timeout recorded, whose action is action
// (suspend, stop).
func (s *Set) IdleTimeout(action string) {
	if s != nil {
		s.idles.get(labels{action}).Inc()
	}
}

// Expired counts an expiry recorded for reason (ttl, retention).
func (s *Set) Expired(reason string) {
	if s != nil {
		s.expirations.get(labels{reason}).Inc()
	}
}

// Registry is the registry of s's collectors, for a caller to add its own.
func (s *Set) Registry() *prometheus.Registry { return s.reg }

// Handler serves s's metrics in the Prometheus text format (GET /metrics).
func (s *Set) Handler() http.Handler {
	return promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
}

// Command records one command of verb, answered with code (OK on success),
// that took d.
func (s *Set) Command(verb, code string, d time.Duration) {
	if s != nil {
		s.commands.get(labels{verb, code}).Observe(d.Seconds())
	}
}

// SagaStep records one step of saga that ended with outcome after d.
func (s *Set) SagaStep(saga, step, outcome string, d time.Duration) {
	if s != nil {
		s.steps.get(labels{saga, step, outcome}).Observe(d.Seconds())
	}
}

// DriverCall records one call of op on driver that answered code (OK on
// success) after d.
func (s *Set) DriverCall(driver, op, code string, d time.Duration) {
	if s != nil {
		s.driverCalls.get(labels{driver, op, code}).Observe(d.Seconds())
	}
}

// Transition counts a sandbox's move from phase from ("" for none) to to.
func (s *Set) Transition(from, to string) {
	if s == nil {
		return
	}
	if from == "" {
		from = "none"
	}
	s.transitions.get(labels{from, to}).Inc()
}

// DeadlineFired counts a passed deadline of phase, settled.
func (s *Set) DeadlineFired(phase string) {
	if s != nil {
		s.deadlines.get(labels{phase}).Inc()
	}
}

// Active counts an activity event of source appended.
func (s *Set) Active(source string) {
	if s != nil {
		s.activity.get(labels{source}).Inc()
	}
}

// Reasons a supervisor report is fenced (Fenced).
const (
	FencedCredential = "credential"
	FencedGeneration = "generation"
)

// Fenced counts a supervisor report ignored for reason (FencedCredential,
// FencedGeneration).
func (s *Set) Fenced(reason string) {
	if s != nil {
		s.fenced.get(labels{reason}).Inc()
	}
}

// Foreign counts a foreign message skipped.
func (s *Set) Foreign() {
	if s != nil {
		s.foreign.Inc()
	}
}

// AppendConflict counts an append refused on a concurrent change.
func (s *Set) AppendConflict() {
	if s != nil {
		s.conflicts.Inc()
	}
}

// DeadlineExtended records a deadline extended for an outage of the log.
func (s *Set) DeadlineExtended() {
	if s != nil {
		s.extended.WithLabelValues("deadline").Inc()
	}
}

// HeartbeatExtended records a heartbeat limit extended for an outage of the
// log.
func (s *Set) HeartbeatExtended() {
	if s != nil {
		s.extended.WithLabelValues("heartbeat").Inc()
	}
}

// AppendRetry counts an append tried again after a conflict.
func (s *Set) AppendRetry() {
	if s != nil {
		s.retries.Inc()
	}
}

// Counter is one counter of a Set with its labels resolved; a nil *Counter
// counts nothing.
type Counter struct{ c prometheus.Counter }

// Inc adds one.
func (c *Counter) Inc() {
	if c != nil {
		c.c.Inc()
	}
}

// Parked is the counter of the events view parks (nil for a nil Set).
func (s *Set) Parked(view string) *Counter {
	if s == nil {
		return nil
	}
	return &Counter{c: s.parked.WithLabelValues(view)}
}

// Phases has every scrape report torpor_sandboxes{phase}: counts' answer,
// and 0 for each of phases it leaves out. A scrape whose counts fails
// reports no sandboxes rather than stale ones.
func (s *Set) Phases(phases []string, counts func(context.Context) (map[string]int, error)) {
	if s == nil {
		return
	}
	desc := prometheus.NewDesc(Namespace+"_sandboxes", "Sandboxes in each phase, as the phase view counts them at scrape time.", []string{"phase"}, nil)
	s.reg.MustRegister(scrape{desc: desc, collect: func(ch chan<- prometheus.Metric) {
		ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
		defer cancel()
		m, err := counts(ctx)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(desc, err)
			return
		}
		for _, p := range phases {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(m[p]), p)
		}
		for p, n := range m {
			if !contains(phases, p) {
				ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(n), p)
			}
		}
	}})
}

// Lags has every scrape report torpor_projection_lag_events{view}: how many
// events of the log each view has yet to apply, as lags answers.
func (s *Set) Lags(lags func(context.Context) map[string]uint64) {
	if s == nil {
		return
	}
	desc := prometheus.NewDesc(Namespace+"_projection_lag_events", "Events of the log a view has yet to apply: the stream's head minus the view's checkpoint.", []string{"view"}, nil)
	s.reg.MustRegister(scrape{desc: desc, collect: func(ch chan<- prometheus.Metric) {
		ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
		defer cancel()
		for view, n := range lags(ctx) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(n), view)
		}
	}})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// scrape is a collector of one metric computed when scraped.
type scrape struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c scrape) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c scrape) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// labels are the values of up to three labels, a key of the caches below.
type labels [3]string

// cached holds the children of a metric vector by their label values, so
// that an observation costs a map read under a read lock, not
// WithLabelValues' hashing and its variadic slice.
type cached[T any] struct {
	with func(...string) T // the vector's WithLabelValues
	n    int               // how many labels it has
	mu   sync.RWMutex
	m    map[labels]T
}

// observers are the histograms of a vector, counters the counters.
type (
	observers = cached[prometheus.Observer]
	counters  = cached[prometheus.Counter]
)

func newObservers(reg *prometheus.Registry, opts prometheus.HistogramOpts, names ...string) *observers {
	opts.Namespace = Namespace
	vec := prometheus.NewHistogramVec(opts, names)
	reg.MustRegister(vec)
	return &observers{with: vec.WithLabelValues, n: len(names), m: map[labels]prometheus.Observer{}}
}

func newCounters(reg *prometheus.Registry, opts prometheus.CounterOpts, names ...string) *counters {
	opts.Namespace = Namespace
	vec := prometheus.NewCounterVec(opts, names)
	reg.MustRegister(vec)
	return &counters{with: vec.WithLabelValues, n: len(names), m: map[labels]prometheus.Counter{}}
}

// get is the child of the label values k (the first n of them).
func (c *cached[T]) get(k labels) T {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok = c.m[k]; !ok {
		v = c.with(k[:c.n]...)
		c.m[k] = v
	}
	return v
}
