// Package gateway is the front door of torpor: the lifecycle state machine
// (one transition table), the sandbox aggregate whose commands are pure
// decisions over folded events, and the command service that loads, decides and
// appends with optimistic concurrency. It serves the commands over the NATS
// micro service "torpor" and over HTTP, and records the outcomes that sagas and
// supervisors report.
package gateway
