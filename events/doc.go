// Package events defines torpor's event log: the envelope every event travels
// in, the stable event types of each lifecycle family, the registry that turns
// a type name back into a struct, the phase view folded from the log, and the
// contract error codes shared by every edge (bus, HTTP, CLI, SDKs).
//
// Event type names are part of the external contract: they are never renamed
// and their fields are only added. Golden files in testdata guard the wire form.
package events
