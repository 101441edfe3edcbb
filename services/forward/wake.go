package forward

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/torpor/torpor/events"
)

// Waker is what a Sandboxes offers when its sandboxes may wake on traffic
// (create's wake_on_traffic): the forwarder asks for it by a type
// assertion, and without it a connection is only held (Config.Hold).
type Waker interface {
	// State is sandbox id's phase, generation and wake_on_traffic now.
	State(ctx context.Context, id string) (State, error)
	// Resume asks for the resume of sandbox id, suspended at generation
	// gen, on behalf of forward fid. However many connections, on however
	// many instances, ask for one suspension, one resume is recorded: its
	// idempotency key is derived from gen.
	Resume(ctx context.Context, id, fid string, gen int64) error
}

// State is what a held connection sees of its sandbox.
type State struct {
	Phase         events.Phase
	Generation    int64
	WakeOnTraffic bool
	// LastOutcome and Reason say why a resume failed.
	LastOutcome string
	Reason      string
}

// Outcomes of a wake, the label of torpor_wakes_total.
const (
	WakeWoken   = "woken"
	WakeFailed  = "failed"
	WakeTimeout = "timeout"
	WakeLimit   = "limit"
)

// wakePoll is how often, at most, a held connection looks at its waking
// sandbox again.
const wakePoll = 5 * time.Millisecond

// WakeKey is the idempotency key of the resume a wake asks for sandbox
// suspended at generation gen: the same for every connection and instance.
func WakeKey(gen int64) string { return fmt.Sprintf("wake-on-traffic-%d", gen) }

// holds counts the connections held for a wake, per sandbox.
type holds struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *holds) take(id string, limit int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	if h.n[id] >= limit {
		return false
	}
	h.n[id]++
	return true
}

func (h *holds) give(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n[id]--; h.n[id] <= 0 {
		delete(h.n, id)
	}
}

// wake holds connection c of s while its sandbox, which wakes on traffic,
// is resumed: it asks for the resume when it finds the sandbox suspended
// and waits (up to Config.WakeTimeout) for ready. woken says it is ready
// (carry dials it then); refused that c was refused, with the line why,
// and the forwarder logged it. Neither: the sandbox does not wake on
// traffic (or is not asleep), and carry holds c as it always does.
func (f *Forwarder) wake(ctx context.Context, s *served, c net.Conn) (woken, refused bool) {
	w, ok := f.sb.(Waker)
	if !ok {
		return false, false
	}
	st, err := w.State(ctx, s.sandbox)
	if err != nil || !st.WakeOnTraffic || st.Phase == events.PhaseReady || !waitable(st.Phase) {
		return false, false
	}
	fail := func(outcome, why string) (bool, bool) {
		f.cfg.Metrics.Wake(outcome)
		f.log.Warn().Str("sandbox_id", s.sandbox).Str("forward", s.id).Str("outcome", outcome).Str("remote", c.RemoteAddr().String()).Msg(why)
		refuse(c, why)
		return false, true
	}
	if !f.held.take(s.sandbox, f.cfg.MaxHeld) {
		return fail(WakeLimit, fmt.Sprintf("sandbox %s is waking; %d connections are held for it already, the connection is refused", s.sandbox, f.cfg.MaxHeld))
	}
	defer f.held.give(s.sandbox)
	// A resume this connection waits on moves the generation past gen0; a
	// sandbox suspended again past it is one whose resume failed, as is
	// one found starting (a resume under way) and suspended again. Found
	// suspended (or suspending) at gen0, it asks for that resume itself.
	gen0, asleep, asked := st.Generation, st.Phase != events.PhaseStarting, false
	deadline := time.Now().Add(f.cfg.WakeTimeout)
	// A wake looks more often than a plain hold: the phase comes from the
	// service's cache, and each look saved is latency the client sees.
	poll := min(f.cfg.Poll, wakePoll)
	for {
		switch {
		case st.Phase == events.PhaseReady:
			f.cfg.Metrics.Wake(WakeWoken)
			return true, false
		case st.Phase == events.PhaseSuspended && (st.Generation > gen0 || !asleep):
			return fail(WakeFailed, fmt.Sprintf("sandbox %s did not wake: its resume failed (%s); it stays suspended", s.sandbox, why(st)))
		case st.Phase == events.PhaseSuspended && !asked:
			asked = true
			rctx, cancel := context.WithDeadline(ctx, deadline)
			err := w.Resume(rctx, s.sandbox, s.id, gen0)
			cancel()
			if err != nil {
				switch {
				case time.Now().After(deadline):
					// the timeout's refusal below
				case events.CodeOf(err) == events.CodeFailedPrecondition, events.CodeOf(err) == events.CodeAborted:
					// moved meanwhile (resumed by another, say): its
					// phase tells below
				default:
					return fail(WakeFailed, fmt.Sprintf("sandbox %s did not wake: %v", s.sandbox, err))
				}
			}
		case !waitable(st.Phase):
			return fail(WakeFailed, fmt.Sprintf("sandbox %s did not wake: it is %s (%s)", s.sandbox, st.Phase, why(st)))
		}
		if time.Now().After(deadline) {
			return fail(WakeTimeout, fmt.Sprintf("sandbox %s did not wake within %s (it is %s); the connection is refused", s.sandbox, f.cfg.WakeTimeout, st.Phase))
		}
		select {
		case <-ctx.Done():
			return false, true
		case <-time.After(poll):
		}
		if st, err = w.State(ctx, s.sandbox); err != nil {
			return fail(WakeFailed, fmt.Sprintf("sandbox %s: %v", s.sandbox, err))
		}
	}
}

// why is what a state says of a failed resume.
func why(st State) string {
	switch {
	case st.Reason != "" && st.LastOutcome != "":
		return st.LastOutcome + ", " + st.Reason
	case st.Reason != "":
		return st.Reason
	case st.LastOutcome != "":
		return st.LastOutcome
	}
	return "see its history"
}

// firstWrite calls first (once) before its first write to w: a woken
// connection's first byte forwarded to the sandbox ends its wake latency.
type firstWrite struct {
	w     io.Writer
	first func()
	once  sync.Once
}

func (fw *firstWrite) Write(p []byte) (int, error) {
	if len(p) > 0 {
		fw.once.Do(fw.first)
	}
	return fw.w.Write(p)
}
