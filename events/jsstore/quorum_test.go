package jsstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
)

// TestAppendWithoutQuorum: on a three-server cluster whose R3 log has lost
// its quorum (two servers shut down, the third leading it: it takes the
// append and can never commit it), an append answers UNAVAILABLE within
// jsstore's bound, however long its caller's context (a create's is 10 s),
// rather than when that context ends; and one in flight with a longer wait
// for its answer is ended by the stream's QUORUM_LOST advisory, when the
// leader steps down, not at its own timeout.
func TestAppendWithoutQuorum(t *testing.T) {
	c := natstest.StartCluster(t, 3, nil)
	js := c.JetStream(t, -1)
	if _, err := jsstore.New(context.Background(), js, jsstore.Config{Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	leader := -1
	for end := time.Now().Add(30 * time.Second); leader < 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no server leads the log")
		}
		leader = c.StreamLeader("$G", jsstore.DefaultStream)
	}
	// The store talks to the leader, which keeps the stream after the
	// others are gone (until it finds its quorum lost, about 10 s).
	ljs := c.JetStream(t, leader)
	s, err := jsstore.Bind(context.Background(), ljs, jsstore.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	const id = "0193b0a4-0000-7000-8000-0000000000c1"
	if _, err := s.Append(context.Background(), id, 0, envelope(t, id, 1)); err != nil {
		t.Fatalf("append with the cluster whole: %v", err)
	}
	for i := range c.Size() {
		if i != leader {
			c.Kill(i)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	_, err = s.Append(ctx, id, 1, envelope(t, id, 2))
	took := time.Since(began)
	t.Logf("append without quorum: %v after %s (bound %s)", err, took.Round(time.Millisecond), jsstore.AppendBound)
	if !errors.Is(err, events.ErrUnavailable) {
		t.Errorf("append without quorum: %v, want UNAVAILABLE", err)
	}
	// Generous: twice the bound, still under the Go bus SDK's 10 s per
	// attempt, and short of the leader's own step-down (about 10 s).
	if took > 2*jsstore.AppendBound {
		t.Errorf("append without quorum answered after %s, want within %s", took.Round(time.Millisecond), jsstore.AppendBound)
	}

	// The advisory ends an append waiting longer than the leader keeps
	// the stream (on a subject of its own: the leader checks an expected
	// sequence against what it proposed, committed or not).
	const other = "0193b0a4-0000-7000-8000-0000000000c2"
	jsstore.SetAnswerTimeout(s, time.Minute)
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began = time.Now()
	_, err = s.Append(ctx, other, 0, envelope(t, other, 1))
	took = time.Since(began)
	t.Logf("append in flight when the leader stepped down: %v after %s", err, took.Round(time.Millisecond))
	if !errors.Is(err, events.ErrUnavailable) || !strings.Contains(err.Error(), "leader went away") {
		t.Errorf("append in flight when the leader stepped down: %v, want UNAVAILABLE, the leader gone", err)
	}
	if took > 45*time.Second {
		t.Errorf("append in flight ended after %s, want at the leader's step-down (10 to 20 s after the others went)", took.Round(time.Millisecond))
	}
}
