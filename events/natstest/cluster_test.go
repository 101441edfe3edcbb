package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events/natstest"
)

// TestIsolateThenKill: a server cut off from the others (Isolate) and then
// shut down hands nothing over: an R3 stream it led has no leader until
// the others' raft election timeout (4 to 9 s in nats-server), where a
// plain Kill hands its leadership over in well under a second. Healed
// and restarted, it rejoins the cluster.
func TestIsolateThenKill(t *testing.T) {
	c := natstest.StartCluster(t, 3, nil)
	js := c.JetStream(t, -1)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// leaderless kills the server leading S (cut off first, if isolate),
	// and says how long S had no leader.
	leaderless := func(isolate bool) time.Duration {
		t.Helper()
		i := -1
		for end := time.Now().Add(30 * time.Second); i < 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("no server leads S")
			}
			i = c.StreamLeader("$G", "S")
		}
		began := time.Now()
		if isolate {
			c.Isolate(i)
		}
		c.Kill(i)
		for c.StreamLeader("$G", "S") < 0 {
			if time.Since(began) > time.Minute {
				t.Fatal("S without a leader for a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(began)
		c.Heal(i)
		c.Restart(i)
		return took
	}
	handed := leaderless(false)
	cut := leaderless(true)
	t.Logf("S had no leader for %s after a kill, %s after a kill of a server cut off", handed.Round(time.Millisecond), cut.Round(time.Millisecond))
	// Half the least election timeout: a handover is far quicker.
	if cut < 2*time.Second {
		t.Errorf("a server cut off and killed left S leaderless for %s, want the others' election timeout (4 s at least)", cut.Round(time.Millisecond))
	}
	if _, err := js.Publish(ctx, "s.x", []byte("after")); err != nil {
		t.Errorf("publish once the server is back: %v", err)
	}
}
