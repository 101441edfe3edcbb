// Package sagas turns intent events (sandbox.created, *_requested) into driver
// calls and records their outcomes through the lifecycle state machine. Each
// saga file opens with its steps; every effect is idempotent per (sandbox,
// generation, step), so a step may run again after a crash without harm.
//
// # Concurrency
//
// Events of one sandbox are handled in order, different sandboxes in
// parallel, at most Config.Workers driver steps at once. A slow driver holds
// up only its own sandbox (and, after a bounded look-ahead, the ack floor
// described below), never the stream.
//
// # Crash recovery
//
// The Runner reads the log through two durable subscriptions:
//
//   - "sagas-ahead" dispatches every intent to its sandbox's queue and
//     acknowledges it at once, so work on many sandboxes overlaps. It runs at
//     most 4×Workers intents ahead of the floor.
//   - "sagas" is the ack floor: its handler returns (acknowledges) an intent
//     only once the intent's step has finished, i.e. its outcome is recorded,
//     or it was found settled or superseded, or its compensation ran. If it
//     meets an intent this process has not dispatched (an intent left over
//     from before a crash, below the look-ahead's position), it dispatches it
//     itself and waits for it.
//
// A crash between an intent and its outcome therefore leaves the intent
// unacknowledged on "sagas", and the next Run re-drives it. Steps that did
// finish may be delivered again; before acting on an intent at sequence S a
// step loads the sandbox's events after S and skips the intent if an event
// caused by it is there (already recorded) or a later intent is (superseded).
// A step that fails (the log unreachable, a record retried to exhaustion) is
// not acknowledged on "sagas" and comes again; an intent is never lost.
//
// # Deadlines
//
// Every driver call runs under the deadline of the transient phase the
// intent opened: the intent's time plus Config.Deadline (a step re-driven
// after a restart does not get a fresh deadline). When it passes, the step
// records sandbox.deadline_passed and the saga's compensation.
package sagas
