package events

import (
	"encoding/json"
	"time"
)

// CreateRequest is the body of a create (CONTRACT §5), on HTTP and the bus.
type CreateRequest struct {
	Name          string            `json:"name,omitempty"`
	Driver        string            `json:"driver,omitempty"`
	DriverOptions map[string]string `json:"driver_options,omitempty"`
	Command       []string          `json:"command,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	// Node is the node the sandbox runs on: the service's own (the
	// default) or one whose drivers it reaches on the bus (torpor serve
	// --remote-nodes).
	Node string `json:"node,omitempty"`
	// TTL or ExpiresAt (RFC 3339) is the sandbox's time to live, OnExpiry
	// what it then does (delete, the default, or stop); RetainFor how
	// long a retained state is held from its suspension (the server's
	// default when empty). See expiry.go.
	TTL       string `json:"ttl,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"`
	OnExpiry  string `json:"on_expiry,omitempty"`
	RetainFor string `json:"retain_for,omitempty"`
	// TTLPausesWhileSuspended: the time the sandbox spends suspended is
	// not counted against its ttl or expires_at (which moves later by it).
	TTLPausesWhileSuspended bool `json:"ttl_pauses_while_suspended,omitempty"`
	// WakeOnTraffic: a connection to a forward of the sandbox while it is
	// suspended resumes it (the forward holds the connection until it is
	// ready). See the README's "Wake on traffic".
	WakeOnTraffic bool `json:"wake_on_traffic,omitempty"`
	// Idle is the sandbox's idle policy (the server's default when nil;
	// idle.go): after is required, action defaults to suspend, fallback
	// to none.
	Idle *IdlePolicy `json:"idle,omitempty"`
}

// Page is one page of a list, in the list's order (creation order unless
// sorted); Next is the opaque cursor of the following page, empty at the
// end.
type Page struct {
	Items []View `json:"items"`
	Next  string `json:"next"`
	// Total is how many sandboxes the list's filters select over all its
	// pages (added to CONTRACT §5's list body), as the view held them when
	// this page was read.
	Total int `json:"total"`
}

// HistoryEntry is one event of the audit history (CONTRACT §3), with the
// phase the sandbox was in after it.
type HistoryEntry struct {
	Seq       uint64          `json:"seq"`
	Type      string          `json:"type"`
	Time      time.Time       `json:"time"`
	Actor     string          `json:"actor"`
	CommandID string          `json:"command_id"`
	Phase     Phase           `json:"phase,omitempty"`
	Data      json.RawMessage `json:"data"`
	// ID, CorrelationID and CausationID are the event's own id and causal
	// metadata (added to the contract's fields): what `torpor check` needs to
	// tell an event appended twice.
	ID            string `json:"id,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	CausationID   string `json:"causation_id,omitempty"`
}

// Envelope is the event of the history entry e of sandbox id, as the log
// holds it (for readers of the history, such as the invariant checker).
func (e HistoryEntry) Envelope(id string) Envelope {
	return Envelope{ID: e.ID, SandboxID: id, Type: e.Type, Schema: SchemaVersion, Time: e.Time, Actor: e.Actor,
		CommandID: e.CommandID, CorrelationID: e.CorrelationID, CausationID: e.CausationID, Phase: e.Phase, Data: e.Data, Seq: e.Seq}
}

// HistoryEntry is e as the history lists it: Envelope's inverse.
func (e Envelope) HistoryEntry() HistoryEntry {
	return HistoryEntry{Seq: e.Seq, Type: e.Type, Time: e.Time, Actor: e.Actor, CommandID: e.CommandID, Phase: e.Phase, Data: e.Data,
		ID: e.ID, CorrelationID: e.CorrelationID, CausationID: e.CausationID}
}

// History is the body of GET /v1/sandboxes/{id}/events.
type History struct {
	Items []HistoryEntry `json:"items"`
}
