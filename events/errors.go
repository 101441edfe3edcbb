package events

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Code is a contract error code (CONTRACT §2), the same on the bus, over HTTP,
// in the CLI and in the SDKs.
type Code string

// The contract's error codes.
const (
	CodeInvalidArgument    Code = "INVALID_ARGUMENT"
	CodeUnauthenticated    Code = "UNAUTHENTICATED"
	CodePermissionDenied   Code = "PERMISSION_DENIED"
	CodeNotFound           Code = "NOT_FOUND"
	CodeFailedPrecondition Code = "FAILED_PRECONDITION"
	CodeAborted            Code = "ABORTED"
	CodeResourceExhausted  Code = "RESOURCE_EXHAUSTED"
	CodeAlreadyExists      Code = "ALREADY_EXISTS"
	CodeUnimplemented      Code = "UNIMPLEMENTED"
	CodeUnavailable        Code = "UNAVAILABLE"
	CodeDeadlineExceeded   Code = "DEADLINE_EXCEEDED"
	CodeInternal           Code = "INTERNAL"
)

// HTTPStatus is the HTTP status that carries c.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeFailedPrecondition, CodeAborted, CodeAlreadyExists:
		return http.StatusConflict
	case CodeResourceExhausted:
		return http.StatusTooManyRequests
	case CodeUnimplemented:
		return http.StatusNotImplemented
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}

// Sentinel errors of the event log. Stores wrap them; CodeOf maps them.
var (
	// ErrConflict: the subject moved past the expected last sequence.
	ErrConflict = errors.New("concurrent change")
	// ErrNotFound: no sandbox (no events) under that id.
	ErrNotFound = errors.New("not found")
	// ErrUnknownType: an event type this build does not know.
	ErrUnknownType = errors.New("unknown event type")
	// ErrUnavailable: the log could not be reached; the append may be retried.
	ErrUnavailable = errors.New("event log unavailable")
)

// Error is an error that carries its contract code. Its message is what
// clients see.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	Err     error  `json:"-"`
}

// Errorf returns an *Error with code c and a formatted message. A %w verb
// keeps the wrapped error reachable through errors.Is.
func Errorf(c Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: c, Message: err.Error(), Err: errors.Unwrap(err)}
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is the sentinel of e's code: an *Error that
// carries its code alone (its Message the code itself, no Err), as the Go
// SDK's ErrNotFound and the others are. So errors.Is(err, torpor.ErrNotFound)
// asks whether err carries NOT_FOUND, whatever its message; any other target
// is compared as errors.Is always does.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && e != nil && t != nil && t.Err == nil && t.Message == string(t.Code) && t.Code == e.Code
}

// ErrorBody is the JSON body of every error reply: {"error":{"code":…,"message":…}}.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// coded is an error of another package that knows its contract code (the
// gateway's transition errors, say).
type coded interface {
	error
	ContractCode() Code
}

// CodeOf maps any error to its contract code; this is the one place where
// errors become codes.
func CodeOf(err error) Code {
	var (
		e  *Error
		cc coded
	)
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	case errors.As(err, &cc):
		return cc.ContractCode()
	case errors.Is(err, ErrNotFound):
		return CodeNotFound
	case errors.Is(err, ErrConflict):
		return CodeAborted
	case errors.Is(err, ErrUnavailable):
		return CodeUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return CodeDeadlineExceeded
	case errors.Is(err, ErrUnknownType):
		return CodeFailedPrecondition
	default:
		return CodeInternal
	}
}

// AsError returns err as an *Error with its contract code, for replies.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeOf(err), Message: err.Error(), Err: err}
}
