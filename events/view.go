package events

import (
	"bytes"
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
	// Forwards are the TCP forwards open to the sandbox (added to CONTRACT
	// §6's fields), in the order they were opened; none once it is deleted.
	Forwards []Forward `json:"forwards,omitempty"`
}

// Forward is one open TCP forward of a view: from Address on torpor's
// host to Port of the sandbox.
type Forward struct {
	ID      string `json:"id"`
	Listen  string `json:"listen"`
	Address string `json:"address"`
	Port    int    `json:"port"`
}

// foldReads are the event types whose fields Fold reads. The others move a
// view by their type alone, so Fold does not decode their data: most of a
// rebuild's events are of those types.
var foldReads = map[string]bool{
	TypeCreated:         true,
	TypeStartRequested:  true,
	TypeStopped:         true,
	TypeSuspendRejected: true,
	TypeResumeRequested: true,
	TypeResumed:         true,
	TypeExited:          true,
	TypeForwardOpened:   true,
	TypeForwardClosed:   true,
}

// foldReadsIf are the event types whose fields Fold reads only when their
// data holds the key: an optional field most of them leave out (a
// snapshot's size, a move to another node), so that the rest are not
// decoded for nothing.
var foldReadsIf = map[string][]byte{
	TypeSuspended:             []byte(`"bytes"`),
	TypeRetainedStateConsumed: []byte(`"node"`),
}

// readsIf says whether env is of a foldReadsIf type with its key.
func readsIf(env Envelope) bool {
	key, ok := foldReadsIf[env.Type]
	return ok && bytes.Contains(env.Data, key)
}

// Fold folds env into v and reports whether it changed v. An event at or below
// v.Seq is skipped (a view never goes back), and so is an event of a type this
// build does not know: projections skip unknown types.
func (v *View) Fold(env Envelope) bool {
	if env.Seq != 0 && env.Seq <= v.Seq {
		return false
	}
	var e Event
	if foldReads[env.Type] || (env.event != nil && env.event.Type() == env.Type) || readsIf(env) {
		var err error
		if e, err = env.Decode(); err != nil {
			return false
		}
	} else if e, _ = New(env.Type); e == nil {
		return false
	}
	if env.Phase != PhaseNone {
		v.Phase = env.Phase
	}
	if env.Seq != 0 {
		v.Seq = env.Seq
	}
	v.UpdatedAt = env.Time
	if v.ID == "" {
		v.ID = env.SandboxID
	}
	switch e := e.(type) {
	case *Created:
		v.Name, v.Driver, v.Node, v.Labels, v.Generation = e.Name, e.Driver, e.Node, e.Labels, e.Generation
		if v.Labels == nil {
			v.Labels = map[string]string{}
		}
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
		v.Restore = Restore{Held: true, Bytes: e.Bytes}
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
	case *RetainedStateDiscarded, *RetainedStateInvalidated:
		v.Restore.Held = false
	case *ResumeFailed:
		v.LastOutcome = OutcomeRestoreFailed
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
	}
	return true
}
