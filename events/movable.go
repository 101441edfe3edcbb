package events

import "fmt"

// RetainedStateExported: the retained state behind RestoreRef is movable
// (issue 29): its driver finished exporting it ahead, in the background
// after the suspension, to where a resume on another node only fetches it,
// under Via, Bytes long. It moves no phase: a fact of suspended, taken only
// while RestoreRef is the state held (the view's Restore.RestoreRef); a
// stale one (of a state consumed, discarded, invalidated or superseded
// since) or a forged one is refused by the aggregate and passed over by
// every view (Restore.Refuses). Whatever ends the hold clears what it says.
type RetainedStateExported struct {
	RestoreRef string `json:"restore_ref"`
	Via        string `json:"via,omitempty"`
	Bytes      int64  `json:"bytes,omitempty"`
}

// Event type names of this family (added to CONTRACT §3's, as allowed):
// stable, never renamed.
const (
	TypeRetainedStateExported = "sandbox.retained_state_exported"
)

func (RetainedStateExported) Type() string { return TypeRetainedStateExported }

// Refuses says why a view whose retained state is r does not take e, ""
// when it does: only a state held (not consumed) behind e's reference is
// made movable. (That the sandbox is suspended is the table's.)
func (r Restore) Refuses(e *RetainedStateExported) string {
	switch {
	case !r.Held || r.Consumed:
		return "no retained state is held"
	case e.RestoreRef == "" || e.RestoreRef != r.RestoreRef:
		return fmt.Sprintf("the retained state held is not %q", e.RestoreRef)
	}
	return ""
}

func init() {
	register(
		func() Event { return &RetainedStateExported{} },
	)
}
