package jsstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/torpor/torpor/events"
)

// Group commit (Config.GroupCommit). A server that syncs every write stores
// one message at a time, each with its own fsync; only an atomic batch
// (ADR-50) is synced once, at its commit (nats-server v2.15.2,
// server/stream.go, processJetStreamAtomicBatchMsg: coalesceSync). Async
// publishes pipelined on one connection share nothing: the stream's one
// goroutine stores them one by one, each flushed and synced in place
// (filestore.go, writeMsgRecordLocked); so do "fast" batches (each member
// goes through commitSingleMsg). So appends in flight at once go to the log
// as one atomic batch across their subjects, each member's first message
// keeping its Nats-Expected-Last-Subject-Sequence, which the server checks
// inside a batch as it does alone (jetstream_batching.go,
// checkMsgHeadersPreClusteredProposal; ADR-50 refuses only
// Nats-Expected-Last-Msg-Id).
//
// A batch has a price of its own: the server stages it in a file store it
// creates (its metadata written with O_SYNC, its directory synced), syncs
// and deletes (newBatchStore, readyForCommit, cleanupLocked). Measured here
// with strace: 100 batches of 8 events took 408 fsyncs with sync always
// (303 with the interval sync) against 805 for 800 single appends, plus
// about 13 unlinks, 19 opens and 3 mkdirs per batch; in a Go trace of 32
// writers (groups of 16) the syscalls of one batch took about 9 ms,
// against about 1 ms for a single append's fsync, on this shared disk, and
// a batch of 2 took 2 to 12 ms, of 32 4 to 19 ms, as the other agents'
// I/O came and went. So a batch pays only for enough members, and how
// many depends on the disk: the store measures both prices (moving
// averages of a single append's time divided by the appends in flight when
// it went, of n singles sent at once divided by n, and of a batch) and
// queues an append only when the appends in flight times a single's price
// reach a batch's. With fewer in flight, an append goes at once, beside
// what is in flight, as it did without group commit. The first append of an idle log goes at once too
// (no added latency); appends that queue behind it go when it returns, as
// one batch (or each on its own, if too few queued), and the next group
// gathers behind that one. Every 256th decision against a batch tries one,
// so that its measured price follows the disk.
//
// Measured (BenchmarkConcurrentAppends: writers appending one event at a
// time, each to its own sandbox, sync always, 3000 events; 2 cores shared
// with six other agents, load average 10 to 12, so every figure moves by a
// factor of 2 between runs): 32 writers 1150 events/s without group commit,
// 3020 with (another run: 1607 and 5665); 64 writers 1075 and 2627 (2969
// and 5047); server messages per event 2.0 and
// 1.03 to 1.07; fsync calls per event (strace, 64 writers) 1.00 without,
// 0.09 with (278 for 3000 events in 52 batches, besides the two O_SYNC
// metadata writes of each batch's staging store); 1 to 8 writers about the
// same either way, nearly no batches. The closed loop of torpor bench (64
// clients, sync always, 5 s runs, interleaved): 410, 419, 385, 374, 386
// and 369 transitions/s before, 872, 554, 333, 695, 396 and 377 after
// (medians 386 and 475), server messages per event 8.9 to 9.1 before, 7.1
// to 7.4 after; with the interval sync (group commit off) 1972, 2465 and,
// in the last, most loaded window, 747. In that window the log was no
// longer what held the loop back: the KV view's writes, one synced put per
// event (raw KV put 1068 to 1901/s in these runs, about 3 events per
// transition), cap it near 400 transitions/s until derived state leaves
// the fsync path (issue 28, item 1).
//
// A batch is all or nothing: when it is refused (one member's expected
// sequence is stale, one member's message id a duplicate of a retry that
// landed, the server has too many batches in flight or the log is full),
// every member is appended again on its own, so that exactly the member in
// conflict gets its usual error and the others land. When its answer is
// lost, each member resolves it as a single append does, by reading its
// subject's last message (a batch lands whole or not at all).
//
// Two members on one subject never share a batch (the server refuses a
// per-subject check on a subject already written in the batch): the later
// one waits for the next group, where its check is made against what the
// first wrote. A queued append waits for its group's answer even when its
// context ends meanwhile (at most the publish timeout, 5 s); one whose
// context ended before its group went is not sent, and answers as a single
// append whose publish never went (what the log holds decides).
//
// Without GroupCommit (serve --fsync interval, or a server of --nats-url)
// every append goes at once, as before: with the interval sync a single
// append takes tens of microseconds and a batch milliseconds. The
// benchmark's group=true rows with interval show it: about the same rate
// up to 8 writers, a third to four fifths of it at 32 and 64, where a
// single's measured price (a round trip with nothing else in flight)
// overstates what it adds to a pipelined server, and batches still win
// the comparison they should lose.
type group struct {
	mu   sync.Mutex
	busy bool // an append or a group is in flight
	// inflight counts the appends under way, queued or not.
	inflight int
	queue    []*member // appends that came meanwhile, in order
	cost     cost
	// prefix and n make batch ids unique.
	prefix string
	n      atomic.Uint64
	// Tests: queued hears the queue's length after each append joins it;
	// always makes every group of two or more a batch.
	queued chan int
	always bool
	// batches and batched count the batches that landed and their members.
	batches, batched atomic.Uint64
}

// cost is what a single append and a batch have taken lately, to choose
// between them: a batch's price depends on the disk (creating, syncing and
// deleting its staging store is metadata work, which a busy disk makes
// slower than the fsync of one append), so it is measured, not assumed.
// Below groupMin members, appends always go each on its own.
type cost struct {
	single, batch time.Duration // moving averages; zero: not measured yet
	skipped       int           // decisions against a batch since the last one for
}

// groupMin is the fewest appends a batch takes: one has nothing to share.
const groupMin = 2

// probeEvery makes every probeEvery-th group that the costs send each on
// its own a batch, so that the cost of a batch follows the disk.
const probeEvery = 256

// groupMax bounds the messages of one batch: nats-server's default
// max_batch_size (1000).
const groupMax = 1000

// ewma moves the average avg towards d by an eighth.
func ewma(avg, d time.Duration) time.Duration {
	if avg == 0 {
		return d
	}
	return avg + (d-avg)/8
}

// asBatch reports whether n appends go as one batch. The lock is held.
func (g *group) asBatch(n int) bool {
	c := &g.cost
	switch {
	case n < groupMin:
		return false
	case g.always, c.batch == 0, c.single == 0, time.Duration(n)*c.single >= c.batch:
		c.skipped = 0
		return true
	}
	if c.skipped++; c.skipped >= probeEvery {
		c.skipped = 0
		return true
	}
	return false
}

// measured notes that n single appends (at once) or one batch took d.
func (g *group) measured(batch bool, n int, d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if batch {
		g.cost.batch = ewma(g.cost.batch, d)
	} else if n > 0 {
		g.cost.single = ewma(g.cost.single, d/time.Duration(n))
	}
}

// member is one Append in a group: its messages, and where its answer goes.
type member struct {
	ctx      context.Context
	id       string
	expected uint64
	envs     []events.Envelope
	msgs     []*nats.Msg
	done     chan result
}

type result struct {
	seq uint64
	err error
}

// append stores m's messages: at once if nothing is in flight, else with the
// group that goes when what is in flight returns.
func (g *group) append(ctx context.Context, s *Store, m *member) (uint64, error) {
	g.mu.Lock()
	g.inflight++
	n := g.inflight
	defer func() {
		g.mu.Lock()
		g.inflight--
		g.mu.Unlock()
	}()
	switch {
	case !g.busy:
		// Nothing in flight: at once, and the group gathers behind it.
		g.busy = true
		g.mu.Unlock()
		start := time.Now()
		seq, err := s.appendNow(ctx, m.id, m.expected, m.envs, m.msgs)
		if err == nil && len(m.msgs) == 1 && n == 1 {
			g.measured(false, 1, time.Since(start))
		}
		g.next(s)
		return seq, err
	case g.always || g.asBatch(n):
		// As many in flight as a batch pays for: wait for the group.
		m.done = make(chan result, 1)
		g.queue = append(g.queue, m)
		if g.queued != nil {
			g.queued <- len(g.queue)
		}
		g.mu.Unlock()
		r := <-m.done
		return r.seq, r.err
	default:
		// Too few for a batch: at once, beside what is in flight, as
		// without group commit. The server stores one message at a
		// time, so it took about n appends' time: that keeps a single's
		// price current under load, when the log is never idle.
		g.mu.Unlock()
		start := time.Now()
		seq, err := s.appendNow(ctx, m.id, m.expected, m.envs, m.msgs)
		if err == nil && len(m.msgs) == 1 {
			g.measured(false, n, time.Since(start))
		}
		return seq, err
	}
}

// next sends the appends that queued meanwhile, or notes that nothing is in
// flight any more.
func (g *group) next(s *Store) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.busy = false
		return
	}
	ms := g.take()
	batch := g.asBatch(len(ms))
	go func() {
		g.flush(s, ms, batch)
		g.next(s)
	}()
}

// take removes the next group from the queue: members in order, one per
// subject, up to groupMax messages (a member that holds more goes alone).
// The lock is held.
func (g *group) take() []*member {
	var ms, rest []*member
	subjects := make(map[string]bool)
	n := 0
	for _, m := range g.queue {
		if subjects[m.id] || (n > 0 && n+len(m.msgs) > groupMax) {
			rest = append(rest, m)
			continue
		}
		subjects[m.id] = true
		n += len(m.msgs)
		ms = append(ms, m)
	}
	g.queue = rest
	return ms
}

// flush sends ms, as one batch if batch, and answers each member.
func (g *group) flush(s *Store, ms []*member, batch bool) {
	var live, ended []*member
	for _, m := range ms {
		if m.ctx.Err() != nil {
			ended = append(ended, m)
		} else {
			live = append(live, m)
		}
	}
	if len(ended) > 0 {
		// Never sent, as a single append whose context ended before its
		// publish: what it answers is what the log holds (a retry that
		// landed before gets its sequence).
		go g.each(ended, func(m *member) (uint64, error) {
			return s.resolve(m.ctx, m.id, m.expected, m.envs, context.Cause(m.ctx))
		})
	}
	start := time.Now()
	if !batch || len(live) < groupMin {
		if g.alone(s, live) {
			g.measured(false, len(live), time.Since(start))
		}
		return
	}
	seq, err := g.batch(s, live)
	switch {
	case err == nil:
		g.measured(true, len(live), time.Since(start))
		g.batches.Add(1)
		g.batched.Add(uint64(len(live)))
		// The batch's messages have the sequences up to seq, in order.
		total := 0
		for _, m := range live {
			total += len(m.msgs)
		}
		first := seq - uint64(total) + 1
		for _, m := range live {
			first += uint64(len(m.msgs))
			m.done <- result{first - 1, nil}
		}
	case classify(err) == unknown:
		_ = g.each(live, func(m *member) (uint64, error) { return s.resolve(m.ctx, m.id, m.expected, m.envs, err) })
	default:
		_ = g.alone(s, live)
	}
}

// alone appends each of ms on its own, all at once, and reports whether
// each was one message that landed (so that the time taken is the price of
// single appends).
func (g *group) alone(s *Store, ms []*member) bool {
	return g.each(ms, func(m *member) (uint64, error) { return s.appendNow(m.ctx, m.id, m.expected, m.envs, m.msgs) })
}

// each answers every member of ms with f, run for all at once, and reports
// whether every member was one message and f answered each without error.
func (g *group) each(ms []*member, f func(*member) (uint64, error)) bool {
	var wg sync.WaitGroup
	var bad atomic.Bool
	for _, m := range ms {
		wg.Go(func() {
			seq, err := f(m)
			if err != nil || len(m.msgs) != 1 {
				bad.Store(true)
			}
			m.done <- result{seq, err}
		})
	}
	wg.Wait()
	return !bad.Load()
}

// batch publishes the messages of ms as one atomic batch and returns the
// sequence of its last message. Like publish, it spares the answer's JSON
// decoding (and it skips orbit.go's round trip on the first message, which
// only checks early what the commit's answer says anyway): the batch costs
// the server one message per event and one answer.
func (g *group) batch(s *Store, ms []*member) (uint64, error) {
	g.mu.Lock()
	if g.prefix == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		g.prefix = hex.EncodeToString(b[:])
	}
	id := g.prefix + "-" + strconv.FormatUint(g.n.Add(1), 10)
	g.mu.Unlock()

	var msgs []*nats.Msg
	for _, m := range ms {
		for _, msg := range m.msgs {
			// A copy: a member appended again on its own carries no
			// batch headers.
			msgs = append(msgs, &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: maps.Clone(msg.Header)})
		}
	}
	for i, msg := range msgs {
		msg.Header.Set(jetstreamext.BatchIDHeader, id)
		msg.Header.Set(jetstreamext.BatchSeqHeader, strconv.Itoa(i+1))
	}
	last := msgs[len(msgs)-1]
	last.Header.Set(jetstreamext.BatchCommitHeader, "1")

	var err error
	op := s.out.begin(time.Now())
	defer func() { s.out.end(op, time.Now(), classify(err) == unknown) }()
	nc := s.js.Conn()
	for _, msg := range msgs[:len(msgs)-1] {
		if err = nc.PublishMsg(msg); err != nil {
			return 0, err
		}
	}
	var seq uint64
	seq, err = s.publish(context.Background(), last)
	return seq, err
}
