package kvview

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/projections"
)

// TestReplayBucketsExpire: a view of the past is made with a TTL on its
// values and a bound on its storage; Reap removes it (and its checkpoint)
// once the TTL has passed since it was made, a rebuild bucket a crash left
// after an hour, and never the live bucket or anything else.
func TestReplayBucketsExpire(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	store := storeWith(t, srv.JS, randomLog(t, 3, 10, 50))
	live := newView(t, srv.JS)
	st, err := live.Rebuild(ctx, store, projections.RebuildOptions{Until: 20})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := srv.JS.KeyValue(ctx, st.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	status, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.TTL() != DefaultPastTTL {
		t.Errorf("the view of the past has TTL %s, want %s", status.TTL(), DefaultPastTTL)
	}
	if info := status.(*jetstream.KeyValueBucketStatus); info.StreamInfo().Config.MaxBytes != DefaultMaxBytes {
		t.Errorf("the view of the past has max bytes %d, want %d", info.StreamInfo().Config.MaxBytes, DefaultMaxBytes)
	}
	leftover := newBucket(t, srv.JS, "torpor_phases_rebuild_1")
	if err := leftover.saveCheckpoint(ctx, 7); err != nil {
		t.Fatal(err)
	}
	newBucket(t, srv.JS, "torpor_phases_other")
	pos, err := srv.JS.KeyValue(ctx, events.PositionBucket)
	if err != nil {
		t.Fatal(err)
	}

	now := time.Now()
	for _, c := range []struct {
		name  string
		after time.Duration
		gone  []string
	}{
		{"soon after", 30 * time.Minute, nil},
		{"a crash's leftover after an hour", 2 * time.Hour, []string{"torpor_phases_rebuild_1"}},
		{"the past after its TTL", DefaultPastTTL + time.Minute, []string{st.Bucket}},
	} {
		t.Run(c.name, func(t *testing.T) {
			gone, err := Reap(ctx, srv.JS, "", DefaultPastTTL, now.Add(c.after))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(gone, c.gone) {
				t.Fatalf("reaped %v, want %v", gone, c.gone)
			}
			for _, b := range c.gone {
				if slices.Contains(buckets(t, srv.JS), b) {
					t.Errorf("bucket %s still there", b)
				}
				if _, err := pos.Get(ctx, checkpointKey(b)); err == nil {
					t.Errorf("checkpoint of %s still there", b)
				}
			}
		})
	}
	if got := buckets(t, srv.JS); !slices.Contains(got, "torpor_phases") || !slices.Contains(got, "torpor_phases_other") {
		t.Errorf("buckets left %v: the live bucket and another must stay", got)
	}
}
