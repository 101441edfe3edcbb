// Package remote carries the driver contract over NATS request/reply
// (CONTRACT §4, "Drivers"): Serve answers for the drivers of one node, and a
// Client is a compute.Driver (with every optional interface but Dialer) that
// calls them, so the sagas drive a sandbox on another machine as they drive
// one in their own process.
//
// # Subjects and the service
//
// Operation op of node N is a request on torpor.driver.N.op, op one of
// capabilities, validate, start, stop, delete, suspend, resume, discard,
// export, observe, logs, check, await_export. Serve registers a NATS micro service named
// torpor-driver (`nats micro ls` lists it, its metadata names the node and
// its drivers) with an endpoint per operation, each in the queue group
// torpor-driver: several processes may serve the same node (a restart
// overlapping its successor, say) and each request is answered by one of
// them. Processes serving one node must serve the same drivers, or a request
// gets the driver of whichever process the queue group picks. A catch-all
// subscription on torpor.driver.N.> (queue group torpor-driver-unknown: in
// the endpoints' group it would take their requests from them) answers an
// operation it does not know with UNIMPLEMENTED, and stays silent for the
// known ones, which their endpoints answer: every request gets exactly one
// answer.
//
// # Requests
//
// The body is one JSON object: the driver's name, an optional timeout, and
// the operation's arguments, one field per kind of argument (the request
// types of compute, with their JSON tags):
//
//	capabilities  {"driver":"sim","options":{…}}
//	validate      {"driver":"sim","spec":{…}}
//	start         {"driver":"sim","start":{"spec":{…},"generation":1,"credential":"…"}}
//	stop, suspend {"driver":"sim","target":{"spec":{…},"generation":1}}
//	resume        {"driver":"sim","resume":{"spec":{…},"generation":2,"credential":"…","restore_ref":"…"}}
//	delete        {"driver":"sim","spec":{…}}
//	discard       {"driver":"sim","spec":{…},"ref":"…"}
//	export        {"driver":"sim","spec":{…},"ref":"…"}
//	observe       {"driver":"sim","spec":{…}}
//	logs          {"driver":"sim","spec":{…},"tail":100}
//	check         {"driver":"vm","spec":{…},"ref":"…"}   (issue 29: can the node restore ref? {} or a rejected error)
//	await_export  {"driver":"vm","spec":{…},"ref":"…"}   (issue 29: wait for ref's export ahead; "ref" and "bytes" of the object, or {} when none)
//
// "timeout_ms" bounds the driver call on the server (the Client sends the
// time it will wait for the answer); without it the call gets
// DefaultTimeout, and no call gets more than MaxTimeout. Fields the server
// does not know are ignored (fields are only added). A request without a
// reply subject (a plain publish) is dropped: nobody asked for its outcome.
//
// # Replies
//
// A reply is one JSON object with the operation's result: "capabilities",
// "ref" (suspend, export, await_export, with "bytes"), "resume" ({"consumed":…}, sent with an error
// too: a failed resume may have consumed the state), "observation", "logs"
// (base64, as JSON carries bytes), or none of them ({}) for a bare success.
// A failure adds
//
//	{"error":{"code":"FAILED_PRECONDITION","kind":"unknown_ref","message":"…"}}
//
// with the contract code of the driver's error (events.CodeOf), its message,
// and the kind: which sentinel of compute it wraps (unimplemented, rejected,
// resource_missing, unknown_ref, unavailable; none for other errors). The
// code alone cannot say it (ErrRejected and ErrUnknownRef share
// FAILED_PRECONDITION), and the Client's error wraps the sentinel the kind
// names again, so errors.Is holds across the bus. An error reply also
// carries micro's Nats-Service-Error and Nats-Service-Error-Code headers.
//
// What the server itself answers:
//
//   - an operation it does not know (torpor.driver.N.frobnicate): UNIMPLEMENTED
//   - a body that is no JSON object, or lacks the operation's argument:
//     INVALID_ARGUMENT
//   - a driver the node does not have: NOT_FOUND (no kind: the node has no
//     such driver, which says nothing of any sandbox's resources)
//   - an operation of an optional interface the driver lacks (suspend of a
//     driver that is no Suspender, say): UNIMPLEMENTED, kind unimplemented
//   - a driver call its timeout or the server's stop ended: UNAVAILABLE,
//     kind unavailable (nothing is known of the effect; it may be repeated)
//   - a reply larger than the connection's max payload: RESOURCE_EXHAUSTED
//
// A validate of a driver that checks no specs (no compute.SpecValidator)
// succeeds, as compute.Registry.Validate does. Capabilities are
// compute.CapabilitiesOf the real driver: a driver that is no Suspender
// answers no suspend, although the Client that asks is one.
//
// # Waiting
//
// A Client waits LongTimeout (30s) for the answer of a call that changes a
// workload (start, stop, delete, suspend, resume, discard, export) and
// ShortTimeout (5s) for one that only looks, less when the call's context
// ends earlier (WithTimeout and WithOpTimeout change them), and sends that
// wait as timeout_ms. No responders, no answer in time, or a connection
// that is gone is an error wrapping compute.ErrUnavailable: the effect is
// unknown, and the sagas call again until the phase's deadline.
//
// # Concurrency
//
// micro calls an endpoint's handler serially, so the handler hands each
// request to a goroutine of its own and returns: calls for
// different sandboxes run at the same time, and a slow resume holds up no
// other call. The server's Stop waits for them. Since the answers are sent
// from those goroutines, micro's statistics count the requests but not
// their errors or processing time.
package remote
