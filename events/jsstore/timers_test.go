package jsstore_test

import (
	"context"
	"slices"
	"testing"

	"github.com/torpor/torpor/events/natstest"
)

// TestTimersKeepKeysPerRunner: a runner's keys outlive the Timers that put
// them (a second store bound to the bucket lists them), another runner's
// are not listed, and a deleted key (or one never kept) is gone.
func TestTimersKeepKeysPerRunner(t *testing.T) {
	srv := natstest.Start(t)
	ctx := context.Background()
	a, err := newStore(t, srv).Timers(ctx, "sagas.n1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := newStore(t, srv).Timers(ctx, "sagas.n2")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := a.List(ctx); err != nil || len(got) != 0 {
		t.Fatalf("List of an empty bucket = %v, %v; want none", got, err)
	}
	const ttl, idle = "0190a0e0-0000-7000-8000-000000000001.ttl", "0190a0e0-0000-7000-8000-000000000001.idle"
	for _, k := range []string{ttl, idle, ttl} {
		if err := a.Put(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.Put(ctx, "0190a0e0-0000-7000-8000-000000000002.retention"); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, idle); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, "0190a0e0-0000-7000-8000-000000000003.ttl"); err != nil {
		t.Fatalf("Delete of a key never kept: %v, want nil", err)
	}
	again, err := newStore(t, srv).Timers(ctx, "sagas.n1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := again.List(ctx)
	if want := []string{ttl}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("List = %v, %v; want %v", got, err, want)
	}
}
