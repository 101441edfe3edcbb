package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
)

// TestNamesWithoutQuorum: on a three-server cluster whose R3 names bucket
// has lost its quorum (two servers shut down, the third leading it: it
// takes the write and can never commit it), a create's name reservation
// and its key's claim answer UNAVAILABLE within the bound, however long
// their caller's context, rather than when that context ends (issue 25:
// commands answer UNAVAILABLE quickly while a bucket has no leader).
func TestNamesWithoutQuorum(t *testing.T) {
	c := natstest.StartCluster(t, 3, nil)
	js := c.JetStream(t, -1)
	if _, err := NewKVNames(context.Background(), js, 3); err != nil {
		t.Fatal(err)
	}
	// Both buckets led by one server, which keeps them after the others
	// are gone (until it finds its quorum lost, some 10 s later).
	leader := -1
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no server leads both buckets")
		}
		if l := c.StreamLeader("$G", "KV_torpor_names"); l >= 0 && l == c.StreamLeader("$G", "KV_torpor_create_keys") {
			leader = l
			break
		}
		if l := c.StreamLeader("$G", "KV_torpor_names"); l >= 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN.KV_torpor_create_keys", nil)
			cancel()
		}
	}
	ljs := c.JetStream(t, leader)
	names, err := NewKVNames(context.Background(), ljs, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := names.Reserve(context.Background(), "whole", "id-0"); err != nil {
		t.Fatalf("reserve with the cluster whole: %v", err)
	}
	for i := range c.Size() {
		if i != leader {
			c.Kill(i)
		}
	}

	for what, call := range map[string]func(context.Context) error{
		"reserve": func(ctx context.Context) error { _, err := names.Reserve(ctx, "alone", "id-1"); return err },
		"claim":   func(ctx context.Context) error { _, err := names.Claim(ctx, "key-1", "id-1"); return err },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		began := time.Now()
		err := call(ctx)
		took := time.Since(began)
		cancel()
		t.Logf("%s without quorum: %v after %s (bound %s)", what, err, took.Round(time.Millisecond), namesBound)
		if got := events.CodeOf(err); got != events.CodeUnavailable {
			t.Errorf("%s without quorum: %v (%s), want UNAVAILABLE", what, err, got)
		}
		// Generous: twice the bound, and short of the leader's own
		// step-down (about 10 s).
		if took > 2*namesBound {
			t.Errorf("%s without quorum answered after %s, want within %s", what, took.Round(time.Millisecond), namesBound)
		}
	}
}
