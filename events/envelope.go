package events

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// SchemaVersion is the envelope schema this build writes.
const SchemaVersion = 1

// Envelope is one event as it stands in the log: the JSON body of a message on
// torpor.sandbox.<id>. Phase is the phase the sandbox is in after the event, as
// the lifecycle table decided when it was appended, so that a projection folds
// the log without a copy of the table and a replay shows what was decided then.
type Envelope struct {
	ID            string          `json:"id"`
	SandboxID     string          `json:"sandbox_id"`
	Type          string          `json:"type"`
	Schema        int             `json:"schema"`
	Time          time.Time       `json:"time"`
	Actor         string          `json:"actor,omitempty"`
	CommandID     string          `json:"command_id,omitempty"`
	CorrelationID string          `json:"correlation_id,omitempty"`
	CausationID   string          `json:"causation_id,omitempty"`
	Phase         Phase           `json:"phase,omitempty"`
	Data          json.RawMessage `json:"data"`

	// Seq is the stream sequence the event was stored at; set by the store on
	// read, never written in the body.
	Seq uint64 `json:"-"`
	// MsgID is the deduplication id of the append; the store sets it on read
	// from the message header. Empty means ID.
	MsgID string `json:"-"`

	// event is the typed event NewEnvelope encoded into Data, so that the
	// writer does not decode what it just encoded. Events are never changed
	// once wrapped.
	event Event
}

// Meta is what a command or a saga step says about who caused an event.
type Meta struct {
	Actor         string
	CommandID     string
	CorrelationID string
	CausationID   string
}

// NewEnvelope wraps e for sandbox id with a fresh uuid v7 event id.
func NewEnvelope(id string, e Event, m Meta, now time.Time) (Envelope, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return Envelope{}, fmt.Errorf("encode %s: %w", e.Type(), err)
	}
	eid, err := uuid.NewV7()
	if err != nil {
		return Envelope{}, fmt.Errorf("event id: %w", err)
	}
	return Envelope{
		ID:            eid.String(),
		SandboxID:     id,
		Type:          e.Type(),
		Schema:        SchemaVersion,
		Time:          now.UTC(),
		Actor:         m.Actor,
		CommandID:     m.CommandID,
		CorrelationID: m.CorrelationID,
		CausationID:   m.CausationID,
		Data:          data,
		event:         e,
	}, nil
}

// DedupID is the message id used to deduplicate the append of e.
func (e Envelope) DedupID() string {
	if e.MsgID != "" {
		return e.MsgID
	}
	return e.ID
}

// Decode returns the typed event inside e, or ErrUnknownType. An event of
// an older schema is read as this build's (RegisterUpcaster).
func (e Envelope) Decode() (Event, error) {
	if e.event != nil && e.event.Type() == e.Type {
		return e.event, nil
	}
	if e.Schema != 0 && e.Schema != schemas.current {
		up, err := schemas.Upcast(e)
		if err != nil {
			return nil, err
		}
		e = up
	}
	return Decode(e.Type, e.Data)
}

// Meta returns the causal metadata of e, for events it causes: same
// correlation, caused by e.
func (e Envelope) Caused(actor string) Meta {
	corr := e.CorrelationID
	if corr == "" {
		corr = e.ID
	}
	return Meta{Actor: actor, CommandID: e.CommandID, CorrelationID: corr, CausationID: e.ID}
}
