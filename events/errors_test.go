package events

import (
	"errors"
	"fmt"
	"testing"
)

// An *Error matches the sentinel of its code, however it is wrapped, and
// nothing else: not another code's sentinel, not another *Error of its code
// that carries a message of its own.
func TestErrorIsCodeSentinel(t *testing.T) {
	notFound := &Error{Code: CodeNotFound, Message: string(CodeNotFound)}
	precond := &Error{Code: CodeFailedPrecondition, Message: string(CodeFailedPrecondition)}
	err := fmt.Errorf("get: %w", Errorf(CodeNotFound, "sandbox %s: no such sandbox", "x"))
	if !errors.Is(err, notFound) {
		t.Errorf("errors.Is(%v, the NOT_FOUND sentinel) = false; want true", err)
	}
	if errors.Is(err, precond) {
		t.Errorf("errors.Is(%v, the FAILED_PRECONDITION sentinel) = true; want false", err)
	}
	if other := Errorf(CodeNotFound, "another message"); errors.Is(err, other) {
		t.Errorf("errors.Is matched an *Error with a message of its own by code")
	}
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeNotFound || e.Message != "sandbox x: no such sandbox" {
		t.Errorf("errors.As: %+v; want the code and message kept", e)
	}
	// The wrapped cause stays reachable.
	cause := errors.New("cause")
	if w := Errorf(CodeUnavailable, "down: %w", cause); !errors.Is(w, cause) || !errors.Is(w, &Error{Code: CodeUnavailable, Message: string(CodeUnavailable)}) {
		t.Errorf("errors.Is lost the cause or the code of %v", w)
	}
}
