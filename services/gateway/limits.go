package gateway

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/torpor/torpor/events"
)

// Limits bound what one request may ask of the service, server-wide. Each
// refusal is INVALID_ARGUMENT (the request is too big or malformed) or
// RESOURCE_EXHAUSTED (the server is full: try later). The README's
// "Limits" table lists them with their defaults; per-token quotas are
// decided before a command reaches the Service and are not kept here.
type Limits struct {
	// Labels bounds a sandbox's labels; LabelValue the bytes of one value.
	// Keys follow the name rule's length, 1 to 63 bytes.
	Labels, LabelValue int
	// Env bounds a sandbox's environment variables; EnvName and EnvValue
	// the bytes of one name and one value.
	Env, EnvName, EnvValue int
	// Options bounds a sandbox's driver options; OptionValue the bytes of
	// one value.
	Options, OptionValue int
	// Args bounds the command's arguments; CommandBytes their total bytes.
	Args, CommandBytes int
	// Event bounds the bytes of one append: the encoded envelopes of a
	// command's events together. It must stay well under the NATS server's
	// max_payload (1 MiB by default), which would refuse it as INTERNAL.
	Event int
	// Watches and Waits bound the watches (GET /v1/watch) and waits
	// (GET …/wait) the HTTP API serves at once; one beyond is refused at
	// once, RESOURCE_EXHAUSTED.
	Watches, Waits int
}

// Default limits (the README's "Limits" table).
const (
	DefaultLabels       = 64
	DefaultLabelValue   = 256
	DefaultEnv          = 128
	DefaultEnvName      = 256
	DefaultEnvValue     = 8 << 10
	DefaultOptions      = 64
	DefaultOptionValue  = 1 << 10
	DefaultArgs         = 256
	DefaultCommandBytes = 16 << 10
	DefaultEvent        = 64 << 10
	DefaultWatches      = 1024
	DefaultWaits        = 4096
)

// defaults fills zero fields.
func (l *Limits) defaults() {
	fill := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	fill(&l.Labels, DefaultLabels)
	fill(&l.LabelValue, DefaultLabelValue)
	fill(&l.Env, DefaultEnv)
	fill(&l.EnvName, DefaultEnvName)
	fill(&l.EnvValue, DefaultEnvValue)
	fill(&l.Options, DefaultOptions)
	fill(&l.OptionValue, DefaultOptionValue)
	fill(&l.Args, DefaultArgs)
	fill(&l.CommandBytes, DefaultCommandBytes)
	fill(&l.Event, DefaultEvent)
	fill(&l.Watches, DefaultWatches)
	fill(&l.Waits, DefaultWaits)
}

// validate reports a limit that cannot work.
func (l Limits) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"labels", l.Labels}, {"label value", l.LabelValue}, {"env", l.Env}, {"env name", l.EnvName},
		{"env value", l.EnvValue}, {"options", l.Options}, {"option value", l.OptionValue}, {"args", l.Args},
		{"command bytes", l.CommandBytes}, {"watches", l.Watches}, {"waits", l.Waits}} {
		if f.v < 1 {
			return fmt.Errorf("gateway: limit of %s %d, want 1 or more", f.name, f.v)
		}
	}
	if l.Event < 4<<10 || l.Event > 1<<20 {
		return fmt.Errorf("gateway: event limit %d bytes, want 4 KiB to 1 MiB (the NATS server's max_payload)", l.Event)
	}
	return nil
}

// maxKey is the longest label key or driver option key, as a name.
const maxKey = 63

// checkCreate refuses a create whose labels, env, driver options or command
// break the limits: too many, too long, or not printable where a terminal
// shows them (labels are listed in CLI tables, and a control character
// there could forge a row). INVALID_ARGUMENT, saying which.
func (l Limits) checkCreate(r *events.CreateRequest) error {
	bad := func(format string, args ...any) error {
		return events.Errorf(events.CodeInvalidArgument, "create: "+format, args...)
	}
	if len(r.Labels) > l.Labels {
		return bad("%d labels, at most %d", len(r.Labels), l.Labels)
	}
	for k, v := range r.Labels {
		if err := checkKey("label", k); err != nil {
			return err
		}
		if len(v) > l.LabelValue {
			return bad("label %q: value of %d bytes, at most %d", k, len(v), l.LabelValue)
		}
		if !printable(v) {
			return bad("label %q: value %q is not printable text (valid UTF-8, no control characters)", k, v)
		}
	}
	if len(r.DriverOptions) > l.Options {
		return bad("%d driver options, at most %d", len(r.DriverOptions), l.Options)
	}
	for k, v := range r.DriverOptions {
		if err := checkKey("driver option", k); err != nil {
			return err
		}
		if len(v) > l.OptionValue {
			return bad("driver option %q: value of %d bytes, at most %d", k, len(v), l.OptionValue)
		}
		if !printable(v) {
			return bad("driver option %q: value %q is not printable text (valid UTF-8, no control characters)", k, v)
		}
	}
	if len(r.Env) > l.Env {
		return bad("%d env variables, at most %d", len(r.Env), l.Env)
	}
	for k, v := range r.Env {
		switch {
		case k == "" || len(k) > l.EnvName:
			return bad("env name %q: want 1 to %d bytes", k, l.EnvName)
		case strings.ContainsRune(k, '=') || !printable(k) || strings.ContainsRune(k, ' '):
			return bad("env name %q: want printable text with no '=' or space", k)
		case len(v) > l.EnvValue:
			return bad("env %s: value of %d bytes, at most %d", k, len(v), l.EnvValue)
		case strings.ContainsRune(v, 0) || !utf8.ValidString(v):
			return bad("env %s: value holds a NUL byte or is not valid UTF-8", k)
		}
	}
	if len(r.Command) > l.Args {
		return bad("command of %d arguments, at most %d", len(r.Command), l.Args)
	}
	total := 0
	for i, a := range r.Command {
		total += len(a)
		if strings.ContainsRune(a, 0) || !utf8.ValidString(a) {
			return bad("command argument %d holds a NUL byte or is not valid UTF-8", i)
		}
	}
	if total > l.CommandBytes {
		return bad("command of %d bytes, at most %d", total, l.CommandBytes)
	}
	return nil
}

// checkKey refuses a label or driver option key that is empty, longer than
// a name, or not printable without spaces.
func checkKey(what, k string) error {
	switch {
	case k == "":
		return events.Errorf(events.CodeInvalidArgument, "create: invalid %s: empty key", what)
	case len(k) > maxKey:
		return events.Errorf(events.CodeInvalidArgument, "create: %s key %.20q…: %d bytes, want 1 to %d", what, k, len(k), maxKey)
	case !printable(k) || strings.ContainsAny(k, " ="):
		return events.Errorf(events.CodeInvalidArgument, "create: %s key %q: want printable text with no space or '='", what, k)
	}
	return nil
}

// printable reports whether s is valid UTF-8 with only printable runes
// (letters, marks, numbers, punctuation, symbols and the ASCII space): no
// control characters (NUL, ESC, newline, tab), no format characters (the
// bidirectional overrides) and no other spaces.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// checkSize refuses an append whose encoded envelopes together exceed the
// event limit, before it reaches the bus.
func (l Limits) checkSize(id string, envs []events.Envelope) error {
	total := 0
	var buf []byte
	for _, env := range envs {
		var err error
		if buf, err = env.AppendJSON(buf[:0]); err != nil {
			return fmt.Errorf("encode %s: %w", env.Type, err)
		}
		total += len(buf)
	}
	if total > l.Event {
		return events.Errorf(events.CodeInvalidArgument, "sandbox %s: the events of this command take %d bytes, at most %d", id, total, l.Event)
	}
	return nil
}
