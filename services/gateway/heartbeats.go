package gateway

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// beatPrefix starts the subject on which a gateway that took a supervisor's
// heartbeat tells every gateway (the reports go to one of them, a queue
// group; the silence of a supervisor must be judged by all alike).
const beatPrefix = "torpor.heartbeat."

// beats is the last heartbeat of each supervisor that has sent one. Only
// those are watched: a supervisor that never heartbeats (the sim's) is never
// taken for silent.
type beats struct {
	mu   sync.Mutex
	last map[string]beat
}

type beat struct {
	gen int64
	at  time.Time
	// extended: the limit was extended for an outage of the log since at.
	extended bool
}

func (b *beats) note(id string, gen int64, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.last[id]; ok && cur.gen > gen {
		return // a late beat of an older generation
	}
	if b.last == nil {
		b.last = map[string]beat{}
	}
	b.last[id] = beat{gen: gen, at: at}
}

// renew notes an attach of generation gen of id at at, if id is watched:
// a supervisor attached (again, or as a resumed generation) is not silent,
// and one that never beat is not watched for it.
func (b *beats) renew(id string, gen int64, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur, ok := b.last[id]; ok && cur.gen <= gen {
		b.last[id] = beat{gen: gen, at: at}
	}
}

func (b *beats) forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.last, id)
}

// silent removes and returns the supervisors whose last beat is older than
// limit at now, the limit extended by the time the log was unavailable since
// that beat (unavailable, when set): a beat that could not reach this
// gateway then is not held against its supervisor. extended is how many
// limits were extended for the first time.
func (b *beats) silent(now time.Time, limit time.Duration, unavailable func(since time.Time) time.Duration) (out map[string]int64, extended int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out = map[string]int64{}
	for id, bt := range b.last {
		if now.Sub(bt.at) <= limit {
			continue
		}
		if unavailable != nil && now.Sub(bt.at) <= limit+unavailable(bt.at) {
			if !bt.extended {
				bt.extended = true
				b.last[id] = bt
				extended++
			}
			continue
		}
		out[id] = bt.gen
		delete(b.last, id)
	}
	return out, extended
}

// listenBeats subscribes to the beats every gateway passes on. A beat
// passed on is the supervisor's own report, its credential checked again:
// bytes anyone else publishes there are dropped, so no one but the
// supervisor can have a sandbox watched (and, once silent, detached).
func (b *Bus) listenBeats() (*nats.Subscription, error) {
	return b.nc.Subscribe(beatPrefix+"*", func(m *nats.Msg) {
		id := strings.TrimPrefix(m.Subject, beatPrefix)
		r, err := b.svc.verify(id, m.Data)
		if err != nil {
			b.log.Debug().Err(err).Str("subject", m.Subject).Msg("beat passed on refused")
			return
		}
		if r.Kind == compute.ReportAttached {
			if r.Beats > 0 {
				// A supervisor that beats is watched from its attach: cut
				// off before its first beat, it is found silent too.
				b.beats.note(id, r.Generation, time.Now())
				return
			}
			b.beats.renew(id, r.Generation, time.Now())
			return
		}
		b.beats.note(id, r.Generation, time.Now())
	})
}

// passOn tells every gateway that a supervisor of id beat or attached:
// report is its report (a heartbeat, or an attach taken).
func (b *Bus) passOn(id string, report []byte) {
	_ = b.nc.Publish(beatPrefix+id, report)
}

// watchBeats records supervisor.detached for each supervisor silent past
// the heartbeat limit, until ctx ends. The table takes a detach in ready
// only (to provisioning, whose deadline then runs); elsewhere it is refused
// and nothing changes.
func (b *Bus) watchBeats(ctx context.Context) {
	limit := b.svc.cfg.HeartbeatLimit
	t := time.NewTicker(limit / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			silent, extended := b.beats.silent(now, limit, b.svc.cfg.Unavailable)
			for range extended {
				b.svc.cfg.Metrics.HeartbeatExtended()
			}
			if extended > 0 {
				b.log.Warn().Int("supervisors", extended).Msg("heartbeat limit extended: the log was unavailable since their last beat")
			}
			for id, gen := range silent {
				err := b.svc.Record(ctx, events.Envelope{SandboxID: id}, "gateway:heartbeats", &events.SupervisorDetached{Generation: gen})
				if err != nil {
					b.log.Debug().Err(err).Str("sandbox_id", id).Int64("generation", gen).Msg("silent supervisor: detach not recorded")
					continue
				}
				b.log.Warn().Str("sandbox_id", id).Int64("generation", gen).Dur("limit", limit).Msg("supervisor silent past the heartbeat limit: detached")
			}
		}
	}
}
