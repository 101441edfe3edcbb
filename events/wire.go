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
}

// Page is one page of a list, in creation order; Next is the opaque cursor of
// the following page, empty at the end.
type Page struct {
	Items []View `json:"items"`
	Next  string `json:"next"`
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
}

// History is the body of GET /v1/sandboxes/{id}/events.
type History struct {
	Items []HistoryEntry `json:"items"`
}
