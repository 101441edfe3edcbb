package main

import (
	"errors"
	"fmt"
	"time"

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

// runAsFlag and runAsUsage are --run-as of serve and driver: whom the
// process driver's workloads run as.
const (
	runAsFlag  = "run-as"
	runAsUsage = "run the process driver's workloads as this user (a name, uid or uid:gid; no supplementary groups); default the service's own user, whose files (--data, admin.token, NATS credentials) they can then read"
)

// positiveDuration is a duration flag that refuses zero and negative values
// when it is parsed (so INVALID_ARGUMENT, naming the flag): the HTTP
// server's timeouts, where zero would mean "none".
type positiveDuration struct{ d *time.Duration }

func (p positiveDuration) String() string {
	if p.d == nil {
		return "0s"
	}
	return p.d.String()
}

func (p positiveDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration (30s, 2m)")
	}
	if d <= 0 {
		return fmt.Errorf("%s: want a positive duration", d)
	}
	*p.d = d
	return nil
}

func (positiveDuration) Type() string { return "duration" }
