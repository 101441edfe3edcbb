package events

import "time"

// Active: the sandbox was active (README "Activity"): a client touched it,
// bytes went through one of its forwards, or its supervisor saw its
// workload busy. Recorded sparsely, at most once per sandbox per activity
// window by a gateway, never once per packet. It moves no phase. At is
// when the activity was seen (for a forward, the first bytes of the
// window); the envelope's time is when it was recorded.
type Active struct {
	Source string    `json:"source"`
	At     time.Time `json:"at"`
}

// Sources of an Active event.
const (
	ActiveTouch      = "touch"
	ActiveForward    = "forward"
	ActiveSupervisor = "supervisor"
)

// ActiveSources are the sources of an Active event, in the order the README
// lists them.
var ActiveSources = []string{ActiveTouch, ActiveForward, ActiveSupervisor}

// Event type names of this family (added to CONTRACT §3's, as allowed):
// stable, never renamed.
const (
	TypeActive = "sandbox.active"
)

func (Active) Type() string { return TypeActive }

func init() {
	register(
		func() Event { return &Active{} },
	)
}
