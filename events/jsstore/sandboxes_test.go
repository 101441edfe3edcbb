package jsstore_test

import (
	"context"
	"slices"
	"testing"

	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
)

// TestSandboxes: every sandbox subject of the stream is listed, in id
// order, one whose messages are all foreign too (the log holds it).
func TestSandboxes(t *testing.T) {
	srv := natstest.Start(t)
	s := newStore(t, srv)
	ctx := context.Background()
	if got, err := s.Sandboxes(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty log: %v, %v; want none", got, err)
	}
	ids := []string{"0193b0a4-0000-7000-8000-000000000003", "0193b0a4-0000-7000-8000-000000000001", "0193b0a4-0000-7000-8000-000000000002"}
	for _, id := range ids {
		if _, err := s.Append(ctx, id, 0, envelope(t, id, 1)); err != nil {
			t.Fatal(err)
		}
	}
	const foreign = "0193b0a4-0000-7000-8000-000000000004"
	if _, err := srv.JS.Publish(ctx, jsstore.Subject(foreign), []byte("not an envelope")); err != nil {
		t.Fatal(err)
	}
	got, err := s.Sandboxes(ctx)
	want := append(slices.Sorted(slices.Values(ids)), foreign)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("sandboxes %v, %v; want %v", got, err, want)
	}
}
