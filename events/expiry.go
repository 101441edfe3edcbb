package events

import "time"

// Expiry (issue 27, items 4 and 5): a sandbox's time to live, set at
// create (ttl or expires_at, with on_expiry), and how long a retained
// state is held after its suspension (retain_for). When either comes due
// the sagas record sandbox.expired naming the policy, appended together
// with the start of what it does.

// Policies of sandbox.expired.
const (
	// ExpiryTTL: the sandbox's expires_at passed.
	ExpiryTTL = "ttl"
	// ExpiryRetention: its retained state was held retain_for since the
	// suspension.
	ExpiryRetention = "retention"
)

// Actions of sandbox.expired (and the values of on_expiry, but none).
const (
	// OnExpiryDelete deletes the sandbox (delete_requested appended with
	// the expiry): the default.
	OnExpiryDelete = "delete"
	// OnExpiryStop stops it: stop_requested when ready; when suspended,
	// the retained state is invalidated and it is stopped at once.
	OnExpiryStop = "stop"
	// ExpiryNone: nothing left to do (a sandbox to stop that is stopped,
	// or in error, already).
	ExpiryNone = "none"
)

// ReasonExpired is the view's reason after an expiry invalidated the
// retained state (sandbox.retained_state_invalidated{reason: Expired}).
const ReasonExpired = "Expired"

// Expired: a policy's time came (a fact of the phase it finds). The
// events that carry out Action follow it in the same append.
type Expired struct {
	Policy    string    `json:"policy"`
	ExpiresAt time.Time `json:"expires_at"`
	Action    string    `json:"action"`
	// RestoreRef is the retained state a retention expiry invalidates.
	RestoreRef string `json:"restore_ref,omitempty"`
}

// TypeExpired is sandbox.expired (added to CONTRACT §3's types).
const TypeExpired = "sandbox.expired"

func (Expired) Type() string { return TypeExpired }

func init() {
	register(func() Event { return &Expired{} })
}

// RetentionEnd is when a retained state held since suspended, under a
// retain_for of retainFor, expires; zero when it is held for ever (no
// retain_for, or one that does not parse).
func RetentionEnd(suspended time.Time, retainFor string) time.Time {
	if retainFor == "" {
		return time.Time{}
	}
	d, err := time.ParseDuration(retainFor)
	if err != nil || d <= 0 {
		return time.Time{}
	}
	return suspended.Add(d)
}

// ParseCreateExpiry checks a create request's expiry fields and resolves them at
// now: the sandbox's expires_at (zero for none), its on_expiry and its
// retain_for (defRetain when the request names none; "" keeps a retained
// state for ever). Both ttl and expires_at, either in the past or zero, a
// malformed one or an unknown on_expiry are INVALID_ARGUMENT.
func ParseCreateExpiry(r CreateRequest, now time.Time, defRetain time.Duration) (at time.Time, on, retain string, err error) {
	switch {
	case r.TTL != "" && r.ExpiresAt != "":
		return at, "", "", Errorf(CodeInvalidArgument, "create: ttl and expires_at: give one")
	case r.TTL != "":
		d, perr := time.ParseDuration(r.TTL)
		if perr != nil || d <= 0 {
			return at, "", "", Errorf(CodeInvalidArgument, "create: ttl %q: want a positive duration (300ms, 2h45m)", r.TTL)
		}
		at = now.Add(d)
	case r.ExpiresAt != "":
		t, perr := time.Parse(time.RFC3339Nano, r.ExpiresAt)
		if perr != nil {
			return at, "", "", Errorf(CodeInvalidArgument, "create: expires_at %q: want an RFC 3339 time", r.ExpiresAt)
		}
		if !t.After(now) {
			return at, "", "", Errorf(CodeInvalidArgument, "create: expires_at %s is not in the future", r.ExpiresAt)
		}
		at = t.UTC()
	}
	switch r.OnExpiry {
	case "":
		if !at.IsZero() {
			on = OnExpiryDelete
		}
	case OnExpiryDelete, OnExpiryStop:
		if at.IsZero() {
			return at, "", "", Errorf(CodeInvalidArgument, "create: on_expiry %q without ttl or expires_at", r.OnExpiry)
		}
		on = r.OnExpiry
	default:
		return at, "", "", Errorf(CodeInvalidArgument, "create: on_expiry %q: want delete or stop", r.OnExpiry)
	}
	if r.TTLPausesWhileSuspended && at.IsZero() {
		return at, "", "", Errorf(CodeInvalidArgument, "create: ttl_pauses_while_suspended without ttl or expires_at")
	}
	switch {
	case r.RetainFor != "":
		d, perr := time.ParseDuration(r.RetainFor)
		if perr != nil || d <= 0 {
			return at, "", "", Errorf(CodeInvalidArgument, "create: retain_for %q: want a positive duration", r.RetainFor)
		}
		retain = d.String()
	case defRetain > 0:
		retain = defRetain.String()
	}
	return at, on, retain, nil
}
