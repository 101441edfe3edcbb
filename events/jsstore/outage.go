package jsstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// maxWindows bounds the outage windows a store remembers: the oldest go
// first (a deadline or a heartbeat limit looks back minutes, not days).
const maxWindows = 256

// outages are the windows in which this process found the log unavailable:
// its connection down, an append or a read that got no answer, a follower
// whose consumer stopped beating. Deadlines and heartbeat limits measured
// across such a window are extended by it (Store.Unavailable): no sandbox
// is judged silent or late for time the log itself could not be reached.
type outages struct {
	mu   sync.Mutex
	wins []window
	// down is when the connection went down; zero while it is up.
	down time.Time
	// conn ends when the connection goes down (and a new one begins with
	// the next connection): a publish in flight then has lost its answer
	// and says so at once, rather than at its timeout.
	conn     context.Context
	connDown context.CancelFunc
	// flying are the starts of the appends and reads in flight, by token:
	// one in flight for longer than slowOp is an outage under way.
	flying map[uint64]time.Time
	token  uint64
}

// slowOp is how long an append or a read of the log may take before the
// log counts as unavailable for as long as it takes: with every write
// fsynced, the log answers in milliseconds, and one that takes a second is
// one whose leader is gone (its answer comes at the timeout).
const slowOp = time.Second

// begin notes an operation in flight from at; end with its token.
func (o *outages) begin(at time.Time) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.flying == nil {
		o.flying = map[uint64]time.Time{}
	}
	o.token++
	o.flying[o.token] = at
	return o.token
}

// end notes the end of operation token at at: an outage from its start
// if it failed for want of the log (failed), or took longer than slowOp.
func (o *outages) end(token uint64, at time.Time, failed bool) {
	o.mu.Lock()
	from := o.flying[token]
	delete(o.flying, token)
	o.mu.Unlock()
	if failed || at.Sub(from) > slowOp {
		o.mark(from, at)
	}
}

func newOutages() *outages {
	o := &outages{}
	o.conn, o.connDown = context.WithCancel(context.Background())
	return o
}

// current ends when the connection now up goes down.
func (o *outages) current() context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.conn
}

type window struct{ from, to time.Time }

// mark notes that the log was unavailable from from to to.
func (o *outages) mark(from, to time.Time) {
	if !to.After(from) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.wins); n > 0 && !from.After(o.wins[n-1].to) {
		// Overlaps the last one (appends failing together): one window.
		o.wins[n-1].to = maxTime(o.wins[n-1].to, to)
		o.wins[n-1].from = minTime(o.wins[n-1].from, from)
		return
	}
	if len(o.wins) == maxWindows {
		o.wins = append(o.wins[:0], o.wins[1:]...)
	}
	o.wins = append(o.wins, window{from, to})
}

// disconnected and reconnected follow the connection.
func (o *outages) disconnected(at time.Time) {
	o.mu.Lock()
	if o.down.IsZero() {
		o.down = at
	}
	o.connDown()
	o.mu.Unlock()
}

// interrupt ends what is in flight now (its answer will not come: the
// stream's leader that was to answer is gone) without the connection going
// down.
func (o *outages) interrupt() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.connDown()
	o.conn, o.connDown = context.WithCancel(context.Background())
}

func (o *outages) reconnected(at time.Time) {
	o.mu.Lock()
	down := o.down
	o.down = time.Time{}
	o.conn, o.connDown = context.WithCancel(context.Background())
	o.mu.Unlock()
	if !down.IsZero() {
		o.mark(down, at)
	}
}

// within is how long the log was unavailable between since and now, the
// windows merged where they overlap.
func (o *outages) within(since, now time.Time) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	wins := o.wins
	var extra []window
	if !o.down.IsZero() {
		extra = append(extra, window{o.down, now})
	}
	for _, from := range o.flying {
		if now.Sub(from) > slowOp {
			extra = append(extra, window{from, now})
		}
	}
	if len(extra) > 0 {
		wins = append(wins[:len(wins):len(wins)], extra...)
		slices.SortFunc(wins, func(a, b window) int { return a.from.Compare(b.from) })
	}
	var total time.Duration
	var reached time.Time // the end of what was counted, to count no overlap twice
	for _, w := range wins {
		from, to := maxTime(w.from, since, reached), minTime(w.to, now)
		if to.After(from) {
			total += to.Sub(from)
		}
		reached = maxTime(reached, w.to)
	}
	return total
}

func maxTime(ts ...time.Time) time.Time {
	m := ts[0]
	for _, t := range ts[1:] {
		if t.After(m) {
			m = t
		}
	}
	return m
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Unavailable is how long, since since, this process found the log
// unavailable (its connection down, appends and reads unanswered, its
// followers' consumers silent). The sagas extend a deadline by it and the
// gateways a heartbeat limit.
func (s *Store) Unavailable(since time.Time) time.Duration {
	return s.out.within(since, time.Now())
}

// watchLeader ends the appends and reads in flight when the stream elects a
// new leader or loses its quorum (the server's advisories): an append the
// old leader took and did not answer would otherwise wait for its timeout,
// and resolving it at once against the new leader tells whether it landed.
// Only a replicated stream has elections.
func (s *Store) watchLeader(nc *nats.Conn) {
	if s.cfg.Replicas < 2 {
		return
	}
	for _, pre := range []string{"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.", "$JS.EVENT.ADVISORY.STREAM.QUORUM_LOST."} {
		// A subscription the server refuses (a user without the
		// advisories) leaves the appends to their timeout, as before.
		_, _ = nc.Subscribe(pre+s.cfg.Stream, func(*nats.Msg) { s.out.interrupt() })
	}
}

// watchConn follows nc's disconnects and reconnects into s.out, keeping
// whatever handlers nc had.
func (s *Store) watchConn(nc *nats.Conn) {
	prevDown, prevUp := nc.Opts.DisconnectedErrCB, nc.Opts.ReconnectedCB
	nc.SetDisconnectErrHandler(func(c *nats.Conn, err error) {
		s.out.disconnected(time.Now())
		if prevDown != nil {
			prevDown(c, err)
		}
	})
	nc.SetReconnectHandler(func(c *nats.Conn) {
		s.out.reconnected(time.Now())
		if prevUp != nil {
			prevUp(c)
		}
	})
}
