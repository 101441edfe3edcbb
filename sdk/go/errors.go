package torpor

import (
	"context"
	"errors"
	"fmt"

	"github.com/torpor/torpor/events"
)

// Error is the error of every call that the server (or the SDK on its
// behalf) answers with a contract code (CONTRACT §2): errors.As(err, &e)
// with e an *Error gives its Code and Message.
type Error = events.Error

// Code is a contract error code.
type Code = events.Code

// The sentinels of the contract's codes: errors.Is(err, ErrNotFound)
// reports whether err carries NOT_FOUND, whatever its message, from either
// client.
var (
	ErrInvalidArgument    = sentinel(events.CodeInvalidArgument)
	ErrUnauthenticated    = sentinel(events.CodeUnauthenticated)
	ErrPermissionDenied   = sentinel(events.CodePermissionDenied)
	ErrNotFound           = sentinel(events.CodeNotFound)
	ErrFailedPrecondition = sentinel(events.CodeFailedPrecondition)
	ErrAborted            = sentinel(events.CodeAborted)
	ErrResourceExhausted  = sentinel(events.CodeResourceExhausted)
	ErrAlreadyExists      = sentinel(events.CodeAlreadyExists)
	ErrUnimplemented      = sentinel(events.CodeUnimplemented)
	ErrUnavailable        = sentinel(events.CodeUnavailable)
	ErrDeadlineExceeded   = sentinel(events.CodeDeadlineExceeded)
	ErrInternal           = sentinel(events.CodeInternal)
)

// sentinel is the error that errors.Is matches to every *Error of code c
// (events.Error.Is): one that carries the code alone.
func sentinel(c Code) error { return &events.Error{Code: c, Message: string(c)} }

// CodeOf is the contract code of err ("" for nil): INTERNAL for an error
// that carries none.
func CodeOf(err error) Code { return events.CodeOf(err) }

// transportError is the error of a call that got no answer because of err:
// DEADLINE_EXCEEDED when ctx's deadline passed, else UNAVAILABLE (a retry
// may reach the server). ctx's error stays reachable through errors.Is.
func transportError(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return events.Errorf(events.CodeDeadlineExceeded, "%s: %w", what, cerr)
		}
		return events.Errorf(events.CodeUnavailable, "%s: %w", what, cerr)
	}
	return events.Errorf(events.CodeUnavailable, "%s: %w", what, err)
}

// retryable reports whether a command that failed with err is worth sending
// again with the same idempotency key: the server could not be reached, or
// answered UNAVAILABLE or ABORTED (a concurrent change).
func retryable(err error) bool {
	var once sentOnce
	if errors.As(err, &once) {
		return false
	}
	switch events.CodeOf(err) {
	case events.CodeUnavailable, events.CodeAborted:
		return true
	}
	return false
}

// sentOnce is the error of a change sent without an idempotency key (the
// token endpoints) that got no answer: it may have been done, and sent again
// it could answer for itself (ALREADY_EXISTS for the token it made,
// NOT_FOUND for the one it revoked), so it is not sent again; the caller
// looks (Tokens) before trying again. An answered UNAVAILABLE or ABORTED
// was not done and is sent again. The TypeScript and Python SDKs do the
// same.
type sentOnce struct{ error }

func (e sentOnce) Unwrap() error { return e.error }

// attempts is how many times a call is sent at most.
const attempts = 5

// retry calls f until it succeeds, fails with an error that is not
// retryable, has been tried attempts times or ctx ends, backing off in
// between.
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	backoff := minBackoff
	for i := 1; ; i++ {
		v, err := f()
		if err == nil || i == attempts || !retryable(err) || ctx.Err() != nil {
			return v, err
		}
		if serr := sleep(ctx, backoff); serr != nil {
			return v, fmt.Errorf("%w (then %v)", err, serr)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}
