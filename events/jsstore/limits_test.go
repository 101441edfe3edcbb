package jsstore_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
)

// TestFullLogIsResourceExhausted: a log at its MaxBytes refuses the next
// append RESOURCE_EXHAUSTED, keeps every event it holds (it is never
// trimmed) and the stream says so in its config.
func TestFullLogIsResourceExhausted(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	s, err := jsstore.New(ctx, srv.JS, jsstore.Config{MaxBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Stream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxBytes != 8<<10 || info.Config.Discard != jetstream.DiscardNew {
		t.Fatalf("stream max bytes %d discard %v, want %d and discard new", info.Config.MaxBytes, info.Config.Discard, 8<<10)
	}
	var appended uint64
	for i := range 1000 {
		id := uuid.Must(uuid.NewV7()).String()
		_, err := s.Append(ctx, id, 0, envelope(t, id, 1))
		if err == nil {
			appended++
			continue
		}
		if got := events.CodeOf(err); got != events.CodeResourceExhausted {
			t.Fatalf("append %d to a full log: got %s (%v), want RESOURCE_EXHAUSTED", i, got, err)
		}
		if appended == 0 {
			t.Fatal("the first append was refused")
		}
		if n := msgCount(t, s); n != appended {
			t.Fatalf("the full log holds %d events, want the %d appended", n, appended)
		}
		return
	}
	t.Fatal("1000 appends fit in 8 KiB")
}

// TestDefaultStorageBound: the log is bounded by default, and New updates
// a stream made by an older build (unbounded, discarding old events) to
// the bound, keeping its events.
func TestDefaultStorageBound(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: jsstore.DefaultStream, Subjects: []string{"torpor.sandbox.>"},
		Discard: jetstream.DiscardOld, AllowDirect: true, AllowAtomicPublish: true, DenyDelete: true, DenyPurge: true, Duplicates: jsstore.DefaultDuplicateWindow}); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, srv)
	info, err := s.Stream().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxBytes != jsstore.DefaultMaxBytes || info.Config.Discard != jetstream.DiscardNew {
		t.Fatalf("stream max bytes %d discard %v, want %d and discard new", info.Config.MaxBytes, info.Config.Discard, int64(jsstore.DefaultMaxBytes))
	}
}
