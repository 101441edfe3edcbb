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

func (SupervisorAttached) Type() string { return "supervisor.attached" }
func (SupervisorDetached) Type() string { return "supervisor.detached" }

func init() {
	register(
		func() Event { return &SupervisorAttached{} },
		func() Event { return &SupervisorDetached{} },
	)
}
