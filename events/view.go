package events

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Forward is the open forward id of the view, if there is one.
func (v View) Forward(id string) (Forward, bool) {
	i := slices.IndexFunc(v.Forwards, func(f Forward) bool { return f.ID == id })
	if i < 0 {
		return Forward{}, false
	}
	return v.Forwards[i], true
}

// Restore says whether a sandbox holds a retained state and whether the last
// one was consumed by a restore.
type Restore struct {
	Held     bool `json:"held"`
	Consumed bool `json:"consumed"`
	// Bytes is what the held state keeps (a VM's snapshot), where the
	// driver says; the state itself is never in the view.
	Bytes int64 `json:"bytes,omitempty"`
	// ExpiresAt is when the held state's retention ends (its suspension
	// plus the sandbox's retain_for); omitted when it is kept for ever.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// RestoreRef is the reference of the state held (added to CONTRACT
	// §6's fields; the suspension's restore_ref, no secret), what a
	// sandbox.retained_state_exported must name to be taken; empty when
	// none is held, and in a view an older build stored.
	RestoreRef string `json:"restore_ref,omitempty"`
	// Movable says the held state was exported ahead (issue 29,
	// sandbox.retained_state_exported): a resume on another node only
	// fetches it, MovableBytes long. Cleared by whatever ends the hold.
	Movable      bool  `json:"movable,omitempty"`
	MovableBytes int64 `json:"movable_bytes,omitempty"`
}

// View is the phase view of one sandbox (CONTRACT §6): what the KV bucket
// torpor_phases holds, what get/list/wait return and what every lifecycle
// command answers with.
type View struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Phase       Phase             `json:"phase"`
	Generation  int64             `json:"generation"`
	Driver      string            `json:"driver"`
	Node        string            `json:"node"`
	Labels      map[string]string `json:"labels"`
	Restore     Restore           `json:"restore"`
	LastOutcome string            `json:"last_outcome"`
	ExitCode    *int              `json:"exit_code"`
	Reason      string            `json:"reason"`
	UpdatedAt   time.Time         `json:"updated_at"`
	Seq         uint64            `json:"seq"`
	// PhaseSince is the time of the event that moved the sandbox into its
	// current phase (added to CONTRACT §6's fields): its age in the phase
	// is now minus PhaseSince. An event that leaves the phase as it was
	// leaves it too. Zero, and left out of the JSON, in a view an older
	// build stored, until its phase next changes: readers then take
	// UpdatedAt (SortTime).
	PhaseSince time.Time `json:"phase_since,omitzero"`
	// Forwards are the TCP forwards open to the sandbox (added to CONTRACT
	// §6's fields), in the order they were opened; none once it is deleted.
	Forwards []Forward `json:"forwards,omitempty"`
	// LastActiveAt is the time of the sandbox's latest activity (added to
	// CONTRACT §6's fields; README "Activity"): the time of an event a
	// client's command appended (Activity), or the At of a sandbox.active.
	// It never goes back. Zero, and left out of the JSON, when there was
	// none (a view an older build stored, until the next activity).
	LastActiveAt time.Time `json:"last_active_at,omitzero"`
	// Joined is set in a command's answer only, never in a stored view:
	// the command met a twin of its verb already in flight (a suspend on
	// suspending, a stop on stopping, a start on starting, a resume on
	// starting after a resume, a delete on deleting), appended nothing,
	// and that command, whose id this is, decides its outcome: wait on
	// the view to see it (the suspend in flight may still be rejected).
	Joined string `json:"joined,omitempty"`
	// ExpiresAt, OnExpiry and RetainFor are the sandbox's expiry policies
	// from its create (expiry.go), each omitted when none.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	OnExpiry  string    `json:"on_expiry,omitempty"`
	RetainFor string    `json:"retain_for,omitempty"`
	// TTLPausesWhileSuspended is create's: ExpiresAt is then the effective
	// expiry, created's moved later by every stay in suspended that ended
	// (from the event that entered suspended to the one that left it).
	// While suspended ExpiryPaused is set and ExpiresAt is the value it
	// had on entering: the stay under way is added when it ends.
	TTLPausesWhileSuspended bool `json:"ttl_pauses_while_suspended,omitempty"`
	ExpiryPaused            bool `json:"expiry_paused,omitempty"`
	// WakeOnTraffic is create's wake_on_traffic (omitted when false).
	WakeOnTraffic bool `json:"wake_on_traffic,omitempty"`
	// Idle is the sandbox's idle policy from its create (idle.go),
	// omitted when none.
	Idle IdlePolicy `json:"idle,omitzero"`
}

// Forward is one open TCP forward of a view: from Address on torpor's
// host to Port of the sandbox.
type Forward struct {
	ID      string `json:"id"`
	Listen  string `json:"listen"`
	Address string `json:"address"`
	Port    int    `json:"port"`
}

// ErrRefused marks an event a reader of the log passes over: the lifecycle
// table refuses its type in the phase the reader folded (Next), or its data
// does not fit its type. The aggregate refused it too (it was never written
// through a gateway: forged, or a writer's bug), so it changes no view;
// readers skip it and count it.
var ErrRefused = errors.New("refused by the lifecycle table")

// SortTime is when the sandbox entered its phase, as a list sorted by age
// in phase takes it: PhaseSince, or UpdatedAt for a view stored before
// views had PhaseSince.
func (v View) SortTime() time.Time {
	if v.PhaseSince.IsZero() {
		return v.UpdatedAt
	}
	return v.PhaseSince
}

// Fold folds env into v and reports whether it changed v: Apply, with an
// event it refuses left out as one that changes nothing.
func (v *View) Fold(env Envelope) bool {
	changed, _ := v.Apply(env)
	return changed
}

// Apply folds env into v through the lifecycle table, as the aggregate
// does, and reports whether it changed v. An event at or below v.Seq is
// skipped (a view never goes back), and so is an event of a type this build
// does not know: projections skip unknown types. An event whose data does
// not decode, or that the table refuses in v's phase, changes nothing and
// comes back as an error wrapping ErrRefused. The phase stamped in the
// envelope is not read: only the table moves a view.
func (v *View) Apply(env Envelope) (bool, error) {
	if env.Seq != 0 && env.Seq <= v.Seq {
		return false, nil
	}
	if !Known(env.Type) {
		return false, nil
	}
	e, err := env.Decode()
	if err != nil {
		return false, fmt.Errorf("%w: sandbox %s seq %d: %w", ErrRefused, env.SandboxID, env.Seq, err)
	}
	to, err := Next(v.Phase, env.Type)
	if err != nil {
		return false, fmt.Errorf("%w: sandbox %s seq %d: %w", ErrRefused, env.SandboxID, env.Seq, err)
	}
	if x, ok := e.(*RetainedStateExported); ok {
		if why := v.Restore.Refuses(x); why != "" {
			return false, fmt.Errorf("%w: sandbox %s seq %d: %s in %s: %s", ErrRefused, env.SandboxID, env.Seq, env.Type, v.Phase, why)
		}
	}
	v.pauseExpiry(to, env.Time)
	if to != v.Phase {
		v.PhaseSince = env.Time
	}
	v.Phase = to
	if env.Seq != 0 {
		v.Seq = env.Seq
	}
	v.UpdatedAt = env.Time
	if v.ID == "" {
		v.ID = env.SandboxID
	}
	if at, ok := Activity(env, e); ok && at.After(v.LastActiveAt) {
		v.LastActiveAt = at
	}
	switch e := e.(type) {
	case *Created:
		v.Name, v.Driver, v.Node, v.Labels, v.Generation = e.Name, e.Driver, e.Node, e.Labels, e.Generation
		if v.Labels == nil {
			v.Labels = map[string]string{}
		}
		v.ExpiresAt, v.OnExpiry, v.RetainFor = e.ExpiresAt, e.OnExpiry, e.RetainFor
		v.TTLPausesWhileSuspended = e.TTLPausesWhileSuspended && !e.ExpiresAt.IsZero()
		v.WakeOnTraffic = e.WakeOnTraffic
		v.Idle = e.Idle
	case *StartRequested:
		v.Generation, v.Reason, v.ExitCode = e.Generation, "", nil
		if e.Fallback {
			v.LastOutcome = OutcomeColdStartFallback
		}
	case *StartFailed:
		v.Reason = ReasonStartFailed
	case *StopRequested, *SuspendRequested, *DeleteRequested:
		v.Reason = ""
	case *Stopped:
		v.Reason = e.Reason
		if e.Reason == ReasonRetainedStateLost {
			v.LastOutcome = OutcomeRestoreFailed
		}
	case *Suspended:
		v.Restore = Restore{Held: true, Bytes: e.Bytes, ExpiresAt: RetentionEnd(env.Time, v.RetainFor), RestoreRef: e.RestoreRef}
	case *SuspendRejected:
		v.LastOutcome, v.Reason = OutcomeSuspendRejected, e.Reason
		if e.Reason == ReasonDeadlineExceeded {
			v.LastOutcome = OutcomeSuspendTimedOut
		}
		if v.Reason == "" {
			v.Reason = ReasonSuspendRejected
		}
	case *ResumeRequested:
		v.Generation, v.Reason = e.Generation, ""
	case *RetainedStateConsumed:
		v.Restore = Restore{Consumed: true}
		if e.Node != "" {
			v.Node = e.Node
		}
	case *RetainedStateDiscarded:
		v.Restore.Held, v.Restore.ExpiresAt = false, time.Time{}
		v.Restore.unhold()
	case *RetainedStateInvalidated:
		v.Restore.Held, v.Restore.ExpiresAt = false, time.Time{}
		v.Restore.unhold()
		if e.Reason == ReasonExpired {
			v.Reason = ReasonExpired
		}
	case *ResumeFailed:
		v.LastOutcome = OutcomeRestoreFailed
		if e.Reason != "" {
			v.Reason = e.Reason // the target refused: why it is suspended again
		}
	case *Resumed:
		v.Generation, v.LastOutcome = e.Generation, e.Outcome
	case *Exited:
		if v.ExitCode == nil {
			code := e.Code
			v.ExitCode = &code
		}
		v.Reason = ReasonMainProcessExited
	case *ResourceLost:
		v.Reason = ReasonComputeResourceMissing
	case *DeadlinePassed:
		v.Reason = ReasonDeadlineExceeded
	case *ForwardOpened:
		// A copy: Fold replaces slices, never edits them (views share them).
		v.Forwards = append(v.Forwards[:len(v.Forwards):len(v.Forwards)],
			Forward{ID: e.ForwardID, Listen: e.Listen, Address: e.Address, Port: e.Port})
	case *ForwardClosed:
		var kept []Forward
		for _, f := range v.Forwards {
			if f.ID != e.ForwardID {
				kept = append(kept, f)
			}
		}
		v.Forwards = kept
	case *Deleted:
		v.Forwards = nil
	case *RetainedStateExported:
		v.Restore.Movable, v.Restore.MovableBytes = true, e.Bytes
	}
	return true, nil
}

// unhold clears what r says of a held state that is held no more.
func (r *Restore) unhold() {
	r.RestoreRef, r.Movable, r.MovableBytes = "", false, 0
}

// pauseExpiry pauses the expiry of a sandbox whose ttl pauses while
// suspended as it enters suspended (phase to, at t) and, as it leaves,
// moves ExpiresAt later by the stay (t minus PhaseSince, the entry).
func (v *View) pauseExpiry(to Phase, t time.Time) {
	if !v.TTLPausesWhileSuspended {
		return
	}
	switch {
	case to == PhaseSuspended && v.Phase != PhaseSuspended:
		v.ExpiryPaused = true
	case v.Phase == PhaseSuspended && to != PhaseSuspended && v.ExpiryPaused:
		if t.After(v.PhaseSince) {
			v.ExpiresAt = v.ExpiresAt.Add(t.Sub(v.PhaseSince))
		}
		v.ExpiryPaused = false
	}
}

// Activity reports whether env (decoded as e) records activity of its
// sandbox, and when (README "Activity"): a sandbox.active at its At (the
// envelope's time when it has none), or an event a client's command
// appended (create, start, stop, suspend, resume, delete, a forward opened
// or closed) at the envelope's time. A fallback start is the resume
// saga's, not a command's, and the outcomes sagas and supervisors report
// are no activity; nor is what an idle timeout appends (actor IdleActor:
// the idle_timeout and the suspend_requested or stop_requested with it).
func Activity(env Envelope, e Event) (time.Time, bool) {
	if env.Actor == IdleActor {
		return time.Time{}, false
	}
	switch e := e.(type) {
	case *Active:
		if e.At.IsZero() {
			return env.Time, true
		}
		return e.At, true
	case *StartRequested:
		return env.Time, !e.Fallback
	case *Created, *StopRequested, *SuspendRequested, *ResumeRequested, *DeleteRequested,
		*RetainedStateDiscarded, *ForwardOpened, *ForwardClosed:
		return env.Time, true
	}
	return time.Time{}, false
}
