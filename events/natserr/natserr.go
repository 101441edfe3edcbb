// Package natserr tells a NATS failure that is the bus not answering (an
// election, a server down, a connection being re-made) from any other, so
// that every entry point answers it UNAVAILABLE: a code a client retries,
// where INTERNAL says "do not".
package natserr

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// Is reports whether err is no answer from the bus: a timeout, no
// responders, no stream answer, no heartbeat, or a connection closed,
// draining or reconnecting; also a context that ended under the call, and
// a JetStream API error with code 503 (JetStream "temporarily
// unavailable" while a server that lost its store catches up, or not yet
// enabled on it), which the server answers for a while and then no more.
func Is(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || apiUnavailable(err) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrConnectionDraining) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrNoHeartbeat)
}

// Unavailable wraps events.ErrUnavailable around err when no answer came
// back (Is), and returns err as is otherwise.
func Unavailable(err error) error {
	if Is(err) {
		return fmt.Errorf("%w: %w", events.ErrUnavailable, err)
	}
	return err
}

// Classify is err for a client: an error with no contract code of its own
// (INTERNAL) that is the bus not answering becomes UNAVAILABLE; any other
// is returned as it is.
func Classify(err error) error {
	if err != nil && events.CodeOf(err) == events.CodeInternal && Is(err) {
		return fmt.Errorf("%w: %w", events.ErrUnavailable, err)
	}
	return err
}

// apiUnavailable reports whether err is a JetStream API error the server
// answered with code 503, in either of nats.go's two API error types.
func apiUnavailable(err error) bool {
	if e, ok := errors.AsType[*jetstream.APIError](err); ok {
		return e.Code == 503
	}
	if e, ok := errors.AsType[*nats.APIError](err); ok {
		return e.Code == 503
	}
	return false
}
