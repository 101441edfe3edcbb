package events

// SupervisorAttached: the supervisor of Generation attached with a credential
// matching the one minted for that generation.
type SupervisorAttached struct {
	Generation int64 `json:"generation"`
}

// SupervisorDetached: the supervisor of Generation went away.
type SupervisorDetached struct {
	Generation int64 `json:"generation"`
}

// Event type names of this family (CONTRACT §3): stable, never renamed.
const (
	TypeSupervisorAttached = "supervisor.attached"
	TypeSupervisorDetached = "supervisor.detached"
)

func (SupervisorAttached) Type() string { return TypeSupervisorAttached }
func (SupervisorDetached) Type() string { return TypeSupervisorDetached }

func (e SupervisorAttached) SpeaksFor() int64 { return e.Generation }
func (e SupervisorDetached) SpeaksFor() int64 { return e.Generation }

func init() {
	register(
		func() Event { return &SupervisorAttached{} },
		func() Event { return &SupervisorDetached{} },
	)
}
