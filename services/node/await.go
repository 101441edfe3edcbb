package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
)

// clusterWait bounds how long a start waits for a NATS cluster that is
// coming up to take streams with the replicas asked.
const clusterWait = time.Minute

// awaitCluster waits until the bus takes JetStream requests of the
// service's account and, for replicas above 1, can place a stream with that
// many replicas: a cluster whose servers are starting answers "JetStream
// not enabled for account" or "no suitable peers for placement" for a
// while, and a start refused for that would need a restart by hand (or by
// compose's and Kubernetes' restart policies). The placement is tried, on
// a bus without the log only, with a small memory stream made and deleted
// at once.
func awaitCluster(ctx context.Context, js jetstream.JetStream, replicas int, node string, log zerolog.Logger) error {
	end := time.Now().Add(clusterWait)
	probe := "torpor_probe_" + node
	var last error
	for tries := 0; ; tries++ {
		last = tryCluster(ctx, js, replicas, probe)
		if last == nil {
			return nil
		}
		if tries == 0 {
			log.Warn().Err(last).Int("replicas", replicas).Msg("the NATS cluster does not take streams yet: waiting for it")
		}
		if time.Now().After(end) {
			return events.Errorf(events.CodeUnavailable, "the NATS cluster took no stream with %d replicas within %s: %v", replicas, clusterWait, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func tryCluster(ctx context.Context, js jetstream.JetStream, replicas int, probe string) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(cctx); err != nil {
		return fmt.Errorf("account info: %w", err)
	}
	if replicas < 2 {
		return nil
	}
	// A bus that has the log already (a restart) is not asked to place
	// anything: a cluster with one server of three down serves its
	// streams, and the restart must not wait for the server.
	if _, err := js.Stream(cctx, jsstore.DefaultStream); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("stream %s: %w", jsstore.DefaultStream, err)
	}
	if _, err := js.CreateOrUpdateStream(cctx, jetstream.StreamConfig{Name: probe, Subjects: []string{"torpor.probe." + probe},
		Storage: jetstream.MemoryStorage, Replicas: replicas, MaxBytes: 1 << 16}); err != nil {
		return fmt.Errorf("place a stream with %d replicas: %w", replicas, err)
	}
	if err := js.DeleteStream(cctx, probe); err != nil {
		return fmt.Errorf("delete the probe stream: %w", err)
	}
	return nil
}
