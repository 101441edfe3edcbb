package events

// ForwardOpened: a TCP forward from Address (bound on torpor's host, asked
// for as Listen) to Port of the sandbox was opened. It moves no phase.
type ForwardOpened struct {
	ForwardID string `json:"forward_id"`
	Listen    string `json:"listen"`
	Address   string `json:"address"`
	Port      int    `json:"port"`
}

// ForwardClosed: the forward ForwardID was closed.
type ForwardClosed struct {
	ForwardID string `json:"forward_id"`
}

// Event type names of this family (added to CONTRACT §3's, as allowed).
const (
	TypeForwardOpened = "sandbox.forward_opened"
	TypeForwardClosed = "sandbox.forward_closed"
)

func (ForwardOpened) Type() string { return TypeForwardOpened }
func (ForwardClosed) Type() string { return TypeForwardClosed }

func init() {
	register(
		func() Event { return &ForwardOpened{} },
		func() Event { return &ForwardClosed{} },
	)
}
