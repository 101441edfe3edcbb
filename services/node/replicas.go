package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// MaxReplicas is the most replicas JetStream keeps of a stream.
const MaxReplicas = 5

// owned says whether a stream of the torpor account is one torpor makes:
// the log, its KV buckets and its object store.
func owned(name string) bool {
	return name == "TORPOR_EVENTS" || strings.HasPrefix(name, "KV_torpor_") || strings.HasPrefix(name, "OBJ_torpor_")
}

// replicaCount is a stream of torpor's and its replicas.
type replicaCount struct {
	stream   string
	replicas int
}

// decideReplicas is the replicas every stream, bucket and object store of
// torpor gets (serve --replicas): asked 0, those the existing streams have
// (1 on a new bus); asked n, n. A stream that exists with fewer than that is
// never used so: the start is refused with how to raise it, unless raise is
// set, when it is raised (JetStream moves the data to the new peers while it
// serves). A stream with more is never lowered by a start: that is a choice
// made with `nats stream edit`, by hand. Config.Validate has kept asked in
// range.
func decideReplicas(ctx context.Context, js jetstream.JetStream, asked int, raise bool) (int, error) {
	var have []replicaCount
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if !owned(name) {
			continue
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			return 0, events.Errorf(events.CodeUnavailable, "stream %s: %v", name, err)
		}
		have = append(have, replicaCount{name, max(s.CachedInfo().Config.Replicas, 1)})
	}
	if err := names.Err(); err != nil {
		return 0, events.Errorf(events.CodeUnavailable, "the streams of the bus: %v", err)
	}
	slices.SortFunc(have, func(a, b replicaCount) int { return strings.Compare(a.stream, b.stream) })
	want := asked
	if want == 0 {
		want = 1
		for _, h := range have {
			want = max(want, h.replicas)
		}
	}
	var fewer, more []string
	for _, h := range have {
		switch {
		case h.replicas < want:
			fewer = append(fewer, fmt.Sprintf("%s (R%d)", h.stream, h.replicas))
		case h.replicas > want:
			more = append(more, fmt.Sprintf("%s (R%d)", h.stream, h.replicas))
		}
	}
	switch {
	case len(more) > 0:
		return 0, events.Errorf(events.CodeFailedPrecondition,
			"--replicas %d, but %s keep more: a start never lowers replicas; start with --replicas %d, or lower them by hand (nats stream edit NAME --replicas %d) first",
			want, strings.Join(more, ", "), maxOf(have), want)
	case len(fewer) > 0 && !raise:
		return 0, events.Errorf(events.CodeFailedPrecondition,
			"--replicas %d, but %s keep fewer: never used so; raise them with `torpor serve --replicas %d --raise-replicas` (or nats stream edit NAME --replicas %d each)",
			want, strings.Join(fewer, ", "), want, want)
	}
	for _, h := range have {
		if h.replicas < want {
			if err := raiseReplicas(ctx, js, h.stream, want); err != nil {
				return 0, err
			}
		}
	}
	return want, nil
}

// raiseIn bounds the wait for a raised stream's new peers to catch up.
const raiseIn = 2 * time.Minute

// raiseReplicas raises stream to want replicas and waits until it has a
// leader and every new peer is current: until then the stream answers
// nothing, and the parts that start next would time out on it.
func raiseReplicas(ctx context.Context, js jetstream.JetStream, stream string, want int) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return events.Errorf(events.CodeUnavailable, "stream %s: %v", stream, err)
	}
	cfg := s.CachedInfo().Config
	cfg.Replicas = want
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return events.Errorf(events.CodeUnavailable, "raise %s to R%d: %v", stream, want, err)
	}
	if err := settled(ctx, s, want); err != nil {
		return events.Errorf(events.CodeUnavailable, "raise %s to R%d: %v", stream, want, err)
	}
	return nil
}

// settled waits until stream s has a leader and, for want above 1, want-1
// replicas, every one current.
func settled(ctx context.Context, s jetstream.Stream, want int) error {
	end := time.Now().Add(raiseIn)
	for {
		info, err := s.Info(ctx)
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" && (want < 2 || len(info.Cluster.Replicas) == want-1 &&
			!slices.ContainsFunc(info.Cluster.Replicas, func(p *jetstream.PeerInfo) bool { return !p.Current })) {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("its peers not current within %s (last: %v)", raiseIn, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// maxOf is the most replicas among have.
func maxOf(have []replicaCount) int {
	n := 1
	for _, h := range have {
		n = max(n, h.replicas)
	}
	return n
}
