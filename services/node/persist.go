package node

import (
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/projections/kvview"
)

// What the node's streams and buckets pay for durability (issue 28, "only
// the log pays for fsync"). With --fsync always the embedded server syncs
// every write of every stream, but only the log is the truth:
//
//   - truth, synced: TORPOR_EVENTS (the log); torpor_names and
//     torpor_create_keys (guards the gateway checks before it appends: a
//     lost reservation would let a second sandbox take a name or a retried
//     create make a second sandbox); torpor_config, the access tokens and
//     quota, the bus's clients (secrets and settings, written seldom);
//     torpor_snapshots (a guest's retained state); torpor_forwards and the
//     leases (written seldom);
//   - derived, synced all the same: torpor_positions (the sagas' positions
//     and the view's checkpoint, a few writes a second: it is the anchor
//     the view's recovery checks its bucket against), torpor_parked (an
//     event parked is seldom, and a lost one would go unnoticed), and the
//     rebuilt buckets of a replay (<bucket>_rebuild_<n>, _at_<seq>: nothing
//     checks them after a crash);
//   - derived, async: torpor_phases, the view, written for every
//     transition. A crash can lose its last writes; New finds out and sets
//     its checkpoint back, and the runner folds the log in again.
//
// Only on the embedded server with one replica: the server refuses async
// persistence on replicated streams, and a server of another process can
// crash (and lose the writes) while this node runs on, past the check New
// makes at start.

// reportPersistence logs the view bucket's persistence when the node
// wanted it async and it is not (a bucket keeps the mode it was made with),
// and what New found when it set the view's checkpoint back after a crash.
func reportPersistence(view *kvview.View, wanted bool, log zerolog.Logger) {
	if wanted && !view.Async() {
		log.Info().Str("bucket", "torpor_phases").Msg("the view's bucket was made before asynchronous persistence: its writes stay synced; delete the bucket (nats kv del torpor_phases) and restart to have it made again, folded from the log")
	}
	if r := view.Recovered(); r != "" {
		log.Warn().Str("bucket", "torpor_phases").Str("found", r).Msg("the view's bucket lost writes in a crash: folding the log into it again from the start")
	}
}
