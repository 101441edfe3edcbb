package kvview

import (
	"time"

	"github.com/torpor/torpor/events"
)

// packed is an entry as the writer's cache keeps it. A whole events.View
// is 408 bytes, and the cache holds a view of every sandbox written lately
// (CacheSize, 100000 by default): most of the writer's heap per idle
// sandbox (issue 28's target). So the fields most views have are kept
// inline, and the view as a whole only when one of the others is set (a
// sandbox's expiry or idle policy, wake on traffic, its forwards, the size
// or retention of its held state, its restore reference and whether it is
// movable): rest, nil for most views.
type packed struct {
	rev, seq       uint64
	generation     int64
	id, name       string
	phase          events.Phase
	driver, node   string
	lastOutcome    string
	reason         string
	labels         map[string]string
	exitCode       *int
	updatedAt      time.Time
	phaseSince     time.Time
	lastActiveAt   time.Time
	held, consumed bool
	rest           *events.View
}

// pack is e as the cache keeps it.
func pack(e entry) packed {
	v := e.view
	if !plain(&v) {
		return packed{rev: e.rev, rest: &v}
	}
	return packed{rev: e.rev, seq: v.Seq, generation: v.Generation, id: v.ID, name: v.Name, phase: v.Phase,
		driver: v.Driver, node: v.Node, lastOutcome: v.LastOutcome, reason: v.Reason, labels: v.Labels,
		exitCode: v.ExitCode, updatedAt: v.UpdatedAt, phaseSince: v.PhaseSince, lastActiveAt: v.LastActiveAt,
		held: v.Restore.Held, consumed: v.Restore.Consumed}
}

// entry is the entry p packed.
func (p packed) entry() entry {
	if p.rest != nil {
		return entry{view: *p.rest, rev: p.rev}
	}
	return entry{rev: p.rev, view: events.View{Seq: p.seq, Generation: p.generation, ID: p.id, Name: p.name, Phase: p.phase,
		Driver: p.driver, Node: p.node, LastOutcome: p.lastOutcome, Reason: p.reason, Labels: p.labels,
		ExitCode: p.exitCode, UpdatedAt: p.updatedAt, PhaseSince: p.phaseSince, LastActiveAt: p.lastActiveAt,
		Restore: events.Restore{Held: p.held, Consumed: p.consumed}}}
}

// plain says every field of v that packed does not keep inline is zero.
// A field added to events.View belongs here (TestPackKeepsEveryField
// fails until it is).
func plain(v *events.View) bool {
	var zero time.Time
	return v.Restore.Bytes == 0 && v.Restore.ExpiresAt == zero && v.Restore.RestoreRef == "" && !v.Restore.Movable &&
		v.Restore.MovableBytes == 0 && v.Forwards == nil && v.Joined == "" &&
		v.ExpiresAt == zero && v.OnExpiry == "" && v.RetainFor == "" && !v.TTLPausesWhileSuspended &&
		!v.ExpiryPaused && !v.WakeOnTraffic && v.Idle == (events.IdlePolicy{})
}
