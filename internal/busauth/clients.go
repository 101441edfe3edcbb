package busauth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go/jetstream"
)

// The clients' account. Producers and dashboards are users of an account
// of their own, TORPOR_CLIENTS, not of the torpor account, because a
// subject permission cannot stop what JetStream does on a user's behalf:
// a user who may make a push consumer names its deliver subject in the
// request's body, and the server delivers there from inside the account
// without asking whether the user may publish there (nats-server issue
// 8274, open). A dashboard of the torpor account could have made the
// stream's messages land on torpor_config's secret, the view or the
// command subjects. In an account of their own, what a client's consumer
// delivers lands among the clients' subjects only.
//
// What the clients' account sees of torpor:
//   - the command subjects torpor.cmd.> and the services' discovery
//     ($SRV.>), imported from the torpor account; a command carries the
//     sender's identity to the service (the import shares it, in the
//     Nats-Request-Info header the server sets), so the actor in the log
//     is the user's name, not a header the client writes;
//   - copies of the stream TORPOR_EVENTS and of the bucket torpor_phases,
//     under the same names: JetStream mirrors, kept by the server, each at
//     the same sequences as its origin, made by torpor (Copies) through
//     the torpor account's consumer API, imported under torpor.js.
//     Readers in this account read the copies; nothing they do reaches
//     the origins.
const (
	// ClientsAPIPrefix is where the clients' account reaches the torpor
	// account's consumer API for the stream and bucket it copies.
	ClientsAPIPrefix = "torpor.js"
	// copyDeliver prefixes the subjects the copies are delivered on.
	copyDeliver = "torpor.copy"
)

// copied are the torpor account's streams the clients' account copies.
var copied = []string{EventStream, "KV_" + PhaseBucket}

// exports are what the torpor account offers the clients' account.
func exports() []*jwt.Export {
	out := []*jwt.Export{
		{Name: "commands", Type: jwt.Service, Subject: "torpor.cmd.>"},
		{Name: "discovery", Type: jwt.Service, Subject: "$SRV.>", ResponseType: jwt.ResponseTypeStream},
		{Name: "copies", Type: jwt.Stream, Subject: copyDeliver + ".>"},
	}
	for _, s := range copied {
		out = append(out,
			&jwt.Export{Type: jwt.Service, Subject: jwt.Subject("$JS.API.CONSUMER.CREATE." + s)},
			&jwt.Export{Type: jwt.Service, Subject: jwt.Subject("$JS.API.CONSUMER.CREATE." + s + ".>")},
			&jwt.Export{Type: jwt.Service, Subject: jwt.Subject("$JS.FC." + s + ".>")},
		)
	}
	return out
}

// imports are what the clients' account takes of the torpor account's
// exports (account is its public key).
func imports(account string) []*jwt.Import {
	out := []*jwt.Import{
		// Share: the service learns who sent each command.
		{Name: "commands", Type: jwt.Service, Account: account, Subject: "torpor.cmd.>", Share: true},
		{Name: "discovery", Type: jwt.Service, Account: account, Subject: "$SRV.>"},
		{Name: "copies", Type: jwt.Stream, Account: account, Subject: copyDeliver + ".>"},
	}
	for _, s := range copied {
		api := jwt.Subject("$JS.API.CONSUMER.CREATE." + s)
		local := jwt.RenamingSubject(ClientsAPIPrefix + ".CONSUMER.CREATE." + s)
		out = append(out,
			&jwt.Import{Type: jwt.Service, Account: account, Subject: api, LocalSubject: local},
			&jwt.Import{Type: jwt.Service, Account: account, Subject: api + ".>", LocalSubject: local + ".>"},
			&jwt.Import{Type: jwt.Service, Account: account, Subject: jwt.Subject("$JS.FC." + s + ".>")},
		)
	}
	return out
}

// CopyLimits bound the clients' copies: each as large as its origin.
type CopyLimits struct {
	// Events is the event stream's MaxBytes; Phases the view bucket's.
	Events, Phases int64
	// Replicas of each copy, as many as the origins have; 0 is 1.
	Replicas int
	// Async makes a new copy with JetStream's asynchronous persistence
	// (one replica only): a copy is derived, and a mirror that lost its
	// last writes in a crash takes them from its origin again, from its
	// own last sequence on. A copy keeps the persistence it was made with.
	Async bool
	// OriginLast reads an origin's last sequence now (stream
	// TORPOR_EVENTS or KV_torpor_phases): a copy past its origin copied
	// writes the origin lost in a crash (the view's bucket is async) and
	// would skip the origin's new writes at those sequences (a mirror
	// takes only sequences past its own), so it is deleted and made
	// again, and copies the origin anew. The copy is read first and its
	// origin after: an origin only grows, so a copy caught up with writes
	// made meanwhile (another serve on the bus) is never taken for one
	// past it, as it was when the origins were read once at the start.
	// Nil checks nothing.
	OriginLast func(ctx context.Context, stream string) (uint64, error)
}

// Copies makes (or updates) the clients' account's copies of the event
// stream and the phase view bucket; js is a connection of a user holding
// ClientsService. The server keeps them up to date from then on, across
// restarts of either side.
func Copies(ctx context.Context, js jetstream.JetStream, lim CopyLimits) error {
	replicas := max(lim.Replicas, 1)
	phases := jetstream.StreamConfig{
		// What CreateKeyValue makes of a KeyValueConfig with a mirror
		// (nats.go v1.55.0), which the KV API binds to as to any bucket.
		Name:              "KV_" + PhaseBucket,
		MaxMsgsPerSubject: 1,
		MaxBytes:          lim.Phases,
		MaxMsgSize:        -1,
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        2 * time.Minute,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		AllowDirect:       true,
		Discard:           jetstream.DiscardNew,
		Mirror: &jetstream.StreamSource{Name: "KV_" + PhaseBucket, External: &jetstream.ExternalStream{
			APIPrefix: ClientsAPIPrefix, DeliverPrefix: copyDeliver + ".phases",
		}},
		MirrorDirect: true,
	}
	evs := jetstream.StreamConfig{
		Name:        EventStream,
		MaxBytes:    lim.Events,
		Replicas:    replicas,
		Storage:     jetstream.FileStorage,
		AllowDirect: true,
		Mirror: &jetstream.StreamSource{Name: EventStream, External: &jetstream.ExternalStream{
			APIPrefix: ClientsAPIPrefix, DeliverPrefix: copyDeliver + ".events",
		}},
	}
	for _, sc := range []jetstream.StreamConfig{phases, evs} {
		if err := makeCopy(ctx, js, sc, lim.Async && replicas == 1, lim.OriginLast); err != nil {
			return fmt.Errorf("the clients' copy of %s: %w", sc.Name, err)
		}
	}
	return nil
}

// makeCopy makes or updates the copy sc, async when new and async is
// asked, else with the persistence it has, after deleting it when it is
// past its origin (CopyLimits.OriginLast).
func makeCopy(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig, async bool, originLast func(context.Context, string) (uint64, error)) error {
	s, err := js.Stream(ctx, sc.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return err
	default:
		info := s.CachedInfo()
		if originLast != nil {
			last, err := originLast(ctx, sc.Mirror.Name)
			if err != nil {
				return fmt.Errorf("its origin: %w", err)
			}
			if info.State.LastSeq > last {
				if err := js.DeleteStream(ctx, sc.Name); err != nil {
					return fmt.Errorf("delete it, past its origin (%d > %d): %w", info.State.LastSeq, last, err)
				}
				break
			}
		}
		async = info.Config.PersistMode == jetstream.AsyncPersistMode
	}
	if async {
		sc.PersistMode = jetstream.AsyncPersistMode
	}
	_, err = js.CreateOrUpdateStream(ctx, sc)
	return err
}
