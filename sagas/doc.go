// Package sagas turns intent events (sandbox.created, *_requested) into driver
// calls and records their outcomes through the lifecycle state machine. Each
// saga file opens with its steps; every effect is idempotent per (sandbox,
// generation, step), so a step may run again after a crash without harm.
//
// # Concurrency
//
// Events of one sandbox are handled in order, different sandboxes in
// parallel, at most Config.Workers driver steps at once; a step backing off
// between calls that got no answer gives its slot back meanwhile. A slow
// driver holds up only its own sandbox, never the log, until 16×Workers
// intents are unfinished; then the Runner reads no further until one
// finishes. Passed deadlines are settled in a lane of their own (as many
// again), before their sandbox's steps that wait for a slot: slow steps
// never delay a deadline.
//
// # Reading the log, and crash recovery
//
// The Runner follows the log (events.Store.Follow: an ordered consumer,
// nothing acknowledged to the server) from its Position, and keeps that
// Position itself: every Config.CheckpointEvery, and when it stops, it saves
// the floor, the highest sequence at or below which every intent has
// finished its step (its outcome is recorded, or it was found settled or
// superseded, or its compensation ran). A crash between an intent and its
// outcome therefore leaves the intent above the saved floor, and the next
// Run re-drives it. Intents that did finish may be read again; before
// acting on an intent at sequence S a step looks at the sandbox's events
// after S and skips the intent if an event caused by it is there (already
// recorded) or a later intent is (superseded).
//
// Those events come from the log itself: every event the Runner reads also
// goes to the jobs waiting in its sandbox's queue, and a job that starts
// after the Runner read a batch that reached the head of the log has seen
// everything that followed its intent, so it needs no round trip. A job
// that starts earlier (catching up after a restart) loads them.
//
// A step that fails (the log unreachable, a record retried to exhaustion)
// runs again after a backoff, holding up only its sandbox; an intent is
// never lost. Each node's Runner reads the whole log and drives only the
// sandboxes created on its node, under a Position of its own.
//
// # Deadlines
//
// Every driver call runs under the deadline of the transient phase the
// intent opened: the intent's time plus Config.Deadline (a step re-driven
// after a restart does not get a fresh deadline). A call that gets no answer
// (compute.ErrUnavailable; for suspend and stop, anything but the driver's
// refusal) is made again after a backoff until then: only an answer is an
// outcome. Every transient phase, whether a step is under way in it or the
// sandbox waits for its supervisor, has the same deadline, counted from the
// event that entered it; when it passes, the runner asks the driver what is
// true and records the phase's outcome or its compensation (deadline.go
// opens with the table). The deadline is durable: the saved position never
// passes the start of a transient phase that has not ended. The clean-up a
// deadline asks of the driver is an intent in the log
// (sandbox.cleanup_requested), driven like any other until the driver
// confirms it (sandbox.cleaned_up; cleanup.go).
//
// # Timers
//
// Deadlines, ttls, retentions and idle policies are one kind of timer
// (timer.go), keyed by sandbox and kind, armed by the events the Runner
// reads; when one comes due its job goes on the sandbox's queue and decides
// again on the sandbox's log (settle, expire, idleCheck): record, rearm,
// park (a ttl paused while suspended) or drop. What a ttl, retention or
// idle timer decides is a command of its own (a command id derived from
// the decision), caused by the event that armed it. A deadline holds the
// saved position; the long timers are kept in Config.Timers instead (their
// keys, at each checkpoint), so a restart arms them again from that record
// without reading the log from a month-old create, and fires what came due
// meanwhile at once.
package sagas
