package main

import (
	"errors"

	"github.com/torpor/torpor/events"
)

// invalid is err, a verb's refusal of the flags or arguments it was given,
// as INVALID_ARGUMENT (CONTRACT §7: bad input gets a contract code); an
// error that carries a code already keeps it.
func invalid(err error) error {
	var ce *events.Error
	if err == nil || errors.As(err, &ce) {
		return err
	}
	return events.Errorf(events.CodeInvalidArgument, "%v", err)
}
