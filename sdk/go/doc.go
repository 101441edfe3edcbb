// Package torpor is the Go SDK of torpor: typed calls for the lifecycle
// commands and the reads, over the HTTP API (CONTRACT §5, New) or over NATS
// (CONTRACT §4, NewBus). It shares only the wire types of package events.
//
// # Clients
//
// Client speaks HTTP to one server: every verb (Create, Start, Stop,
// Suspend, Resume, Delete, Lifecycle), the reads (Get, GetAt, List, ListWith
// with its filters and sorts, History, Logs, Drivers, Phases), Wait and
// Watch. Bus speaks to the service on a NATS connection: the same verbs as
// request/reply on torpor.cmd.<verb>, Get, List and Phases from the KV bucket torpor_phases,
// History from the stream TORPOR_EVENTS, Wait from a KV watch of the
// sandbox's key and Watch from a KV watch of the bucket. Both satisfy
// Sandboxes and Watcher. Client's LifecycleWait and CreateWait send a
// command that waits for its own outcome (?wait=true): one round trip where
// a command and then WaitAfter make two.
//
// # Idempotency and retries
//
// Every command carries an idempotency key: the one given, or a fresh uuid
// v7 when it is "" (Start, Stop and Suspend always make one). A command
// that got no answer (a dropped connection, a timeout) or the answer
// UNAVAILABLE or ABORTED is sent again a few times with backoff under the
// same key, so that however often it was sent it is in the log once
// (CONTRACT §1, invariant 4). Pass a key of your own to make your own
// retries, across processes, just as safe.
//
// # Errors
//
// Every error a call returns carries a contract code (CONTRACT §2), from
// either client: test it with errors.Is(err, ErrFailedPrecondition) (and
// ErrNotFound, ErrInvalidArgument, …), or take code and message with
// errors.As(err, &e) where e is an *Error. A call that could not reach the
// server is UNAVAILABLE; one whose ctx deadline passed is
// DEADLINE_EXCEEDED, one whose ctx was cancelled UNAVAILABLE, and both keep
// ctx's error reachable (errors.Is(err, context.Canceled)).
//
// # Phases are an open set
//
// A newer server may add phases (CONTRACT §1). A view with a phase this SDK
// does not know decodes as it is, its Phase the server's string, and every
// call returns it unchanged. Callers must treat such a phase as "other":
// switch on the phases they handle with a default branch, never assume the
// list is complete; Phase.Known says whether a phase is one of this build's,
// Terminal and Transient are false for an unknown one (so a wait for another
// phase goes on through it). Waiting for a phase the server does not know is
// INVALID_ARGUMENT over HTTP, and waits forever on the bus.
//
// # Watch
//
// Watch streams view changes, from the server's current views on (after 0)
// or after a seq the caller saw last. Both clients resume by themselves
// after a dropped connection and drop any view whose seq is at or below
// one already delivered for its sandbox: nothing is delivered twice, each
// sandbox's views come in rising seq order, and no sandbox's latest view
// is missed. A view the server replaced while the connection was down may
// be skipped in favour of the newer one: the phase view keeps the latest
// view of each sandbox, not every one (the history has every event).
//
// # Compatibility
//
// The exported API only grows; api.txt lists it and a test holds it to
// that. Interfaces are kept minimal because a method added to an exported
// interface breaks every implementation outside this package (a test's
// fake): a new capability gets an interface of its own.
package torpor

import (
	"context"

	"github.com/torpor/torpor/events"
)

// Sandboxes is what both clients do with sandboxes: the lifecycle
// commands and Get. Its method set is frozen: a capability added to the
// SDK gets an interface of its own (as Watcher), never a method here,
// which would break every implementation outside the package.
type Sandboxes interface {
	Create(ctx context.Context, r CreateRequest, key string) (events.View, error)
	Get(ctx context.Context, id string) (events.View, error)
	Start(ctx context.Context, id string) (events.View, error)
	Stop(ctx context.Context, id string) (events.View, error)
	Suspend(ctx context.Context, id string) (events.View, error)
	Resume(ctx context.Context, id string, o ResumeOptions, key string) (events.View, error)
	Delete(ctx context.Context, id, key string) (events.View, error)
}

// Watcher streams view changes (Client.Watch, Bus.Watch). Its method set is
// frozen, as Sandboxes' is.
type Watcher interface {
	Watch(ctx context.Context, after uint64, fn func(events.View) error) error
}

var (
	_ Sandboxes = (*Client)(nil)
	_ Sandboxes = (*Bus)(nil)
	_ Watcher   = (*Client)(nil)
	_ Watcher   = (*Bus)(nil)
)
