package remote

import (
	"errors"
	"strings"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// ServiceName is the name of the NATS micro service Serve registers,
// QueueGroup the queue group of its endpoints, and CatchAllQueueGroup that
// of the catch-all of unknown operations. The two must differ: of the
// subscriptions in one queue group that match a message, the server hands
// it to one, and the catch-all matches every operation's subject.
const (
	ServiceName        = "torpor-driver"
	QueueGroup         = "torpor-driver"
	CatchAllQueueGroup = "torpor-driver-unknown"
)

// The operations of the driver contract, each the last token of its subject.
const (
	OpCapabilities = "capabilities"
	OpValidate     = "validate"
	OpStart        = "start"
	OpStop         = "stop"
	OpDelete       = "delete"
	OpSuspend      = "suspend"
	OpResume       = "resume"
	OpDiscard      = "discard"
	OpExport       = "export"
	OpObserve      = "observe"
	OpLogs         = "logs"
	// OpCheck asks whether the node can restore a retained state (issue
	// 29, compute.Checker): spec and ref, answered by an error alone.
	OpCheck = "check"
	// OpAwaitExport waits for the export ahead of a suspension's retained
	// state (compute.ExportAwaiter, issue 29); a node that does not know it
	// answers UNIMPLEMENTED.
	OpAwaitExport = "await_export"
)

// Ops lists every operation, in the order of the contract.
var Ops = []string{OpCapabilities, OpValidate, OpStart, OpStop, OpDelete, OpSuspend, OpResume, OpDiscard, OpExport, OpObserve, OpLogs, OpCheck, OpAwaitExport}

// Server-side bounds of a driver call: DefaultTimeout for a request that
// names none, and never more than MaxTimeout, so that no call outlives the
// caller by much.
const (
	DefaultTimeout = 30 * time.Second
	MaxTimeout     = 10 * time.Minute
)

// Prefix is the prefix of every subject of node's drivers.
func Prefix(node string) string { return "torpor.driver." + node + "." }

// Subject is the subject of operation op of node's drivers.
func Subject(node, op string) string { return Prefix(node) + op }

// checkNode says why node cannot be one token of a subject, if it cannot.
func checkNode(node string) error {
	if node == "" || strings.ContainsAny(node, ".*> \t\r\n") {
		return events.Errorf(events.CodeInvalidArgument, "node %q: want one subject token (no dots, wildcards or spaces)", node)
	}
	return nil
}

// Request is the body of every request: the driver, the call's timeout and
// the operation's arguments (see the package comment for which operation
// takes which).
type Request struct {
	Driver string `json:"driver"`
	// TimeoutMS bounds the driver call on the server, in milliseconds;
	// zero means DefaultTimeout.
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	Options   map[string]string `json:"options,omitempty"`
	Spec      *compute.Spec     `json:"spec,omitempty"`
	Start     *compute.Start    `json:"start,omitempty"`
	Target    *compute.Target   `json:"target,omitempty"`
	Resume    *compute.Resume   `json:"resume,omitempty"`
	Ref       string            `json:"ref,omitempty"`
	Tail      int               `json:"tail,omitempty"`
}

// Reply is the body of every reply: the operation's result, and Error when
// it failed. A resume sends its result with its error too.
type Reply struct {
	Error        *Error                `json:"error,omitempty"`
	Capabilities *compute.Capabilities `json:"capabilities,omitempty"`
	Ref          string                `json:"ref,omitempty"`
	Resume       *compute.ResumeResult `json:"resume,omitempty"`
	Observation  *compute.Observation  `json:"observation,omitempty"`
	Logs         []byte                `json:"logs,omitempty"`
	// Bytes is an awaited export's size (OpAwaitExport), its reference Ref.
	Bytes int64 `json:"bytes,omitempty"`
}

// The kinds of Error: which sentinel of compute an error wraps.
const (
	KindUnimplemented   = "unimplemented"
	KindRejected        = "rejected"
	KindResourceMissing = "resource_missing"
	KindUnknownRef      = "unknown_ref"
	KindUnavailable     = "unavailable"
)

// kinds maps kinds to sentinels, in the order a server looks for them in an
// error (the first one wrapped names the kind).
var kinds = []struct {
	kind string
	err  error
}{
	{KindUnknownRef, compute.ErrUnknownRef},
	{KindRejected, compute.ErrRejected},
	{KindResourceMissing, compute.ErrResourceMissing},
	{KindUnimplemented, compute.ErrUnimplemented},
	{KindUnavailable, compute.ErrUnavailable},
}

// Error is a driver's error as it crosses the bus, and as a Client returns
// it: its message, its contract code (ContractCode, which events.CodeOf
// reads) and the sentinel its Kind names (Unwrap, which errors.Is reads).
type Error struct {
	Code    events.Code `json:"code"`
	Kind    string      `json:"kind,omitempty"`
	Message string      `json:"message"`
}

// errorOf is err as it is sent.
func errorOf(err error) *Error {
	e := &Error{Code: events.CodeOf(err), Message: err.Error()}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			e.Kind = k.kind
			break
		}
	}
	return e
}

func (e *Error) Error() string { return e.Message }

// ContractCode is the code the server sent, or INTERNAL if it sent none.
func (e *Error) ContractCode() events.Code {
	if e.Code == "" {
		return events.CodeInternal
	}
	return e.Code
}

// Unwrap is the sentinel of compute that Kind names, or nil.
func (e *Error) Unwrap() error {
	for _, k := range kinds {
		if k.kind == e.Kind {
			return k.err
		}
	}
	return nil
}
