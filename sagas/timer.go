package sagas

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
)

// Timers (issue 27): every timed decision of the runner is one timer, keyed
// by sandbox and kind, armed by an event it read (or, for a long timer,
// rebuilt at start from the durable record, Timers):
//
//   kind        armed by                                  when it comes due (a job on the sandbox's queue)
//   deadline    the entry into a transient phase          settle (deadline.go)
//   ttl         created{expires_at}, a move to this node  expire (expiry.go)
//   retention   suspended, with retain_for                expire (expiry.go)
//   idle        ready, with an idle policy                idleCheck (idle.go)
//
// A timer is armed (replacing the one of its key), disarmed, due (its job
// queued behind its sandbox's steps; a deadline before those that wait for a
// slot), rearmed by its job (not due yet, refused: look again) or dropped
// by it (nothing to do). A ttl paused while suspended is parked: armed, its
// clock stopped, until an event leaves suspended (unpark).
//
// Every job decides again on the sandbox's log, never on what armed the
// timer: a timer armed early, late, twice or from the record only costs a
// load. What a long timer decides is a command of its own (firing): its
// causation is the event that armed it, its command id is derived from the
// decision, so that two runners firing the same decision name one command,
// which the gateway appends once (it refuses the second on the state).
//
// Durability. A deadline is short (Config.Deadline): the saved position
// never passes the event that armed one still armed, and a restart reads
// it again. A long timer (ttl, retention, idle: days) must not hold the
// position, or a restart would read the log again from a month-old create.
// With Config.Timers, the runner keeps the keys of its armed long timers
// in that record, at each checkpoint, before it saves a position past the
// event that armed one; at start it arms every key recorded at once, and
// each job finds the due time (or nothing to do) in the sandbox's log. The
// record holds keys only, not times: a ttl that moves (paused while
// suspended) or an idle timer armed anew by every activity writes nothing,
// only arming and disarming do, and a key left stale costs one load at
// the next start. The view would do as well for the times, but it lags the
// log (a timer armed above the view's position would be lost) and listing
// every sandbox at start costs more than the keys of those with a timer.
// Without Config.Timers, long timers hold the position as deadlines do.

// Kinds of timer.
const (
	kindDeadline  = "deadline"
	kindTTL       = events.ExpiryTTL
	kindRetention = events.ExpiryRetention
	kindIdle      = "idle"
)

// timerKey names a timer: its sandbox and its kind.
type timerKey struct{ id, kind string }

// long says whether a timer of k's kind may outlive the position: it is
// kept in Config.Timers instead.
func (k timerKey) long() bool { return k.kind != kindDeadline }

// timer is one armed timer, as the runner read the log.
type timer struct {
	key timerKey
	// env is the event that armed it; for a timer rebuilt from the record
	// at start only its SandboxID is set (the job finds the arming event
	// in the log: armedBy).
	env events.Envelope
	t   *time.Timer
	// extended is how long a deadline was extended for outages of the log
	// within it (Config.Unavailable).
	extended time.Duration
	// parked: a ttl paused while suspended, its clock stopped until an
	// event leaves suspended; left is the newest sequence read with a
	// phase other than suspended (see park).
	parked bool
	left   uint64
}

// arm arms the timer k, armed by env, to come due at at, in place of the
// one armed under k; r.mu is held.
func (r *Runner) arm(ctx context.Context, k timerKey, env events.Envelope, at time.Time) *timer {
	r.disarm(k)
	x := &timer{key: k, env: env}
	x.t = time.AfterFunc(time.Until(at), func() { r.due(ctx, x) })
	r.timers[k] = x
	return x
}

// disarm forgets the timer k; r.mu is held.
func (r *Runner) disarm(k timerKey) {
	if x := r.timers[k]; x != nil {
		x.t.Stop()
		delete(r.timers, k)
	}
}

// armed says whether x is the timer armed under its key; r.mu is held.
func (r *Runner) armed(x *timer) bool { return r.timers[x.key] == x }

// due queues the job of x on its sandbox's queue, behind any step under
// way there, unless x was disarmed or replaced meanwhile. A deadline goes
// before the steps waiting for a slot (work) and wakes its sandbox's
// worker waiting for one.
func (r *Runner) due(ctx context.Context, x *timer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := x.key.id
	if r.stopping || !r.armed(x) {
		return
	}
	if r.enqueue(&job{env: x.env, timer: x}) {
		r.warm.Go(func() { r.work(ctx, id) })
	}
	if w := r.waking[id]; w != nil && x.key.kind == kindDeadline {
		// Its worker waits for a slot for a step: the deadline goes first.
		close(w)
		delete(r.waking, id)
	}
}

// fire is the job of x come due: its kind's decision. A nil error means
// it is done with (recorded, rearmed, parked or dropped); an error brings
// it back after a backoff.
func (r *Runner) fire(ctx context.Context, x *timer) error {
	switch x.key.kind {
	case kindDeadline:
		return r.settle(ctx, x)
	case kindTTL, kindRetention:
		return r.expire(ctx, x)
	case kindIdle:
		return r.idleCheck(ctx, x)
	}
	r.drop(x)
	return nil
}

// rearm makes x come due again after d, if it is still armed.
func (r *Runner) rearm(x *timer, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopping && r.armed(x) {
		x.parked = false
		x.t.Reset(d)
	}
}

// drop forgets x, if it is still armed: its job found nothing to do.
func (r *Runner) drop(x *timer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.armed(x) {
		r.disarm(x.key)
	}
}

// park stops x, a ttl paused while suspended as the log read up to head
// says, until an event leaves suspended (unpark); one already read past
// head (left) comes due again at once.
func (r *Runner) park(x *timer, head uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping || !r.armed(x) {
		return
	}
	if x.left > head {
		x.t.Reset(0)
		return
	}
	x.t.Stop()
	x.parked = true
}

// unpark notes that the runner read env, an event of k's sandbox with a
// phase other than suspended: a timer parked under k comes due again (its
// job reads the time its stay moved it to); r.mu is held.
func (r *Runner) unpark(k timerKey, env events.Envelope) {
	x := r.timers[k]
	if x == nil {
		return
	}
	x.left = max(x.left, env.Seq)
	if x.parked {
		x.parked = false
		x.t.Reset(0)
	}
}

// stopTimers stops every timer: Run is ending; r.mu is held.
func (r *Runner) stopTimers() {
	for _, x := range r.timers {
		x.t.Stop()
	}
}

// rebuild arms every long timer the record keeps, due now: the job of each
// reads its time in the sandbox's log (before Run follows the log).
func (r *Runner) rebuild(ctx context.Context) error {
	if r.cfg.Timers == nil {
		return nil
	}
	keys, err := r.cfg.Timers.List(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for _, name := range keys {
		key, ok := parseTimerKey(name)
		if !ok {
			r.log.Warn().Str("key", name).Msg("a key of the timers' record that names no timer: left there")
			continue
		}
		r.arm(ctx, key, events.Envelope{SandboxID: key.id}, now)
		r.kept[key] = true
	}
	r.log.Info().Int("timers", len(keys)).Msg("long timers rebuilt from the record")
	return nil
}

// keep brings the record of long timers up to date before a checkpoint:
// every long timer armed by an event at or below the sequence the floor
// would reach without it is put in the record, every key recorded with no
// timer armed is deleted. A key whose put failed holds the floor, as
// without a record.
func (r *Runner) keep(ctx context.Context) {
	if r.cfg.Timers == nil {
		return
	}
	r.mu.Lock()
	f := r.floorLocked(false)
	var puts, dels []timerKey
	for k, x := range r.timers {
		if k.long() && !r.kept[k] && x.env.Seq <= f {
			puts = append(puts, k)
		}
	}
	for k := range r.kept {
		if r.timers[k] == nil {
			// Forgotten before the delete: a timer armed again meanwhile
			// holds the floor until it is put again.
			delete(r.kept, k)
			dels = append(dels, k)
		}
	}
	r.mu.Unlock()
	for _, k := range dels {
		if err := r.cfg.Timers.Delete(ctx, k.String()); err != nil {
			// Still in the record: deleted at a later checkpoint, or, left
			// stale, its job at the next start finds nothing to do.
			if ctx.Err() == nil {
				r.log.Warn().Err(err).Str("sandbox_id", k.id).Str("timer", k.kind).Msg("delete a timer from the record")
			}
			r.mu.Lock()
			r.kept[k] = true
			r.mu.Unlock()
		}
	}
	for _, k := range puts {
		if err := r.cfg.Timers.Put(ctx, k.String()); err != nil {
			if ctx.Err() == nil {
				r.log.Warn().Err(err).Str("sandbox_id", k.id).Str("timer", k.kind).Msg("put a timer in the record; it holds the position")
			}
			continue
		}
		r.mu.Lock()
		r.kept[k] = true // disarmed meanwhile: deleted at the next checkpoint
		r.mu.Unlock()
	}
}

// firing is the command id of what the long timer k decides with
// evidence (the time it came due at, and what it judged): derived, so
// that every runner firing the same decision names the same command.
func firing(k timerKey, evidence ...string) string {
	b := []byte(k.id + "\x00" + k.kind)
	for _, e := range evidence {
		b = append(append(b, 0), e...)
	}
	return uuid.NewSHA1(firingSpace, b).String()
}

// firingSpace is the uuid namespace of the timers' command ids.
var firingSpace = uuid.MustParse("2f140438-2323-4acf-84ee-096d118cfd88")

// cause is the envelope a long timer's decision is caused by: the event
// that armed it, or for one rebuilt at start the one that armed it as the
// sandbox's log says (armedBy), with the decision's own command id.
func cause(x *timer, log []events.Envelope, command string) events.Envelope {
	env := x.env
	if env.ID == "" {
		env = armedBy(x.key.kind, log)
	}
	env.CommandID = command
	return env
}

// armedBy is the newest event of log that arms a long timer of kind: for
// a ttl the create or a move to another node, for a retention the
// suspension, for idle the newest activity or entry into ready; the last
// event if none does.
func armedBy(kind string, log []events.Envelope) events.Envelope {
	var found events.Envelope
	prev := events.PhaseNone
	for _, env := range log {
		arms := false
		switch kind {
		case kindTTL:
			arms = env.Type == events.TypeCreated || movedTo(env) != ""
		case kindRetention:
			arms = env.Type == events.TypeSuspended
		case kindIdle:
			if e, err := env.Decode(); err == nil {
				_, active := events.Activity(env, e)
				arms = active || (env.Phase == events.PhaseReady && prev != events.PhaseReady)
			}
		}
		if arms {
			found = env
		}
		prev = env.Phase
	}
	if found.ID == "" && len(log) > 0 {
		found = log[len(log)-1]
	}
	return found
}

// Timers keeps, between runs, the keys of the long timers (ttl, retention,
// idle) a Runner has armed, so that its saved position may pass the events
// that armed them (see the top of timer.go); a key is
// "<sandbox id>.<kind>", kind ttl, retention or idle (TimerKey). It is
// safe for concurrent use; jsstore.Store.Timers keeps them in a KV bucket.
type Timers interface {
	// List returns every key kept.
	List(ctx context.Context) ([]string, error)
	// Put keeps key; Delete forgets it (a key not kept is no error).
	Put(ctx context.Context, key string) error
	Delete(ctx context.Context, key string) error
}

// TimerKey is the key in Timers of the long timer of kind for sandbox id.
func TimerKey(id, kind string) string { return timerKey{id, kind}.String() }

func (k timerKey) String() string { return k.id + "." + k.kind }

// parseTimerKey reads a key of Timers; false when it names no long timer.
func parseTimerKey(s string) (timerKey, bool) {
	id, kind, ok := strings.Cut(s, ".")
	k := timerKey{id, kind}
	return k, ok && events.ValidID(id) && (kind == kindTTL || kind == kindRetention || kind == kindIdle)
}
