package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestServeConfigValidate: every flag serve cannot work with is refused
// before anything starts, naming the flag.
func TestServeConfigValidate(t *testing.T) {
	good := serveConfig{Data: t.TempDir(), HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Fsync: "always", Node: "local", Deadline: time.Minute, DuplicateWindow: time.Minute, HeartbeatLimit: 15 * time.Second}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, runAs := range []string{"root", "0", "65534:65534"} {
		c := good
		c.RunAs = runAs
		if err := c.Validate(); err != nil {
			t.Errorf("run as %q: %v", runAs, err)
		}
	}
	for _, node := range []string{"n", "rack_1-b", strings.Repeat("n", 63)} {
		c := good
		c.Node = node
		if err := c.Validate(); err != nil {
			t.Errorf("node %q: %v", node, err)
		}
	}
	cases := []struct {
		name, flag string
		edit       func(*serveConfig)
	}{
		{"fsync", "--fsync", func(c *serveConfig) { c.Fsync = "sometimes" }},
		{"deadline", "--deadline", func(c *serveConfig) { c.Deadline = 0 }},
		{"no duplicate window", "--duplicate-window", func(c *serveConfig) { c.DuplicateWindow = 0 }},
		{"duplicate window under a second", "--duplicate-window", func(c *serveConfig) { c.DuplicateWindow = 500 * time.Millisecond }},
		{"no heartbeat limit", "--heartbeat-limit", func(c *serveConfig) { c.HeartbeatLimit = 0 }},
		{"a heartbeat limit too short to beat within", "--heartbeat-limit", func(c *serveConfig) { c.HeartbeatLimit = 2 * time.Nanosecond }},
		{"no data", "--data", func(c *serveConfig) { c.Data = "" }},
		{"no http", "--http", func(c *serveConfig) { c.HTTP = "" }},
		{"nats listen", "--nats-listen", func(c *serveConfig) { c.NATSListen = "nowhere" }},
		{"nats listen port", "--nats-listen", func(c *serveConfig) { c.NATSListen = "127.0.0.1:nats" }},
		{"empty node", "--node", func(c *serveConfig) { c.Node = "" }},
		{"node with a dot", "--node", func(c *serveConfig) { c.Node = "rack.1" }},
		{"node with a wildcard", "--node", func(c *serveConfig) { c.Node = "n*" }},
		{"node too long", "--node", func(c *serveConfig) { c.Node = strings.Repeat("n", 64) }},
		{"upper-case node", "--node", func(c *serveConfig) { c.Node = "Rack1" }},
		{"node ending in a dash", "--node", func(c *serveConfig) { c.Node = "rack-" }},
		{"run as an unknown user", "--run-as", func(c *serveConfig) { c.RunAs = "no-such-user-torpor" }},
		{"run as no uid:gid", "--run-as", func(c *serveConfig) { c.RunAs = "1:x" }},
		{"negative log bound", "--max-log-bytes", func(c *serveConfig) { c.MaxLogBytes = -2 }},
		{"negative replay ttl", "--replay-ttl", func(c *serveConfig) { c.ReplayTTL = -time.Hour }},
	}
	for _, tc := range cases {
		c := good
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: Validate = %v, want an error naming %s", tc.name, err, tc.flag)
		}
	}
}

// TestDuplicateWindowReachesStream: --duplicate-window sets how long the
// event stream remembers message ids, and a restart with another window
// changes the existing stream's.
func TestDuplicateWindowReachesStream(t *testing.T) {
	dir := t.TempDir()
	for _, want := range []time.Duration{30 * time.Second, 3 * time.Minute} {
		a := startApp(t, dir, func(c *serveConfig) { c.DuplicateWindow = want })
		info, err := a.store.Stream().Info(t.Context())
		if err != nil {
			t.Fatalf("stream info: %v", err)
		}
		if got := info.Config.Duplicates; got != want {
			t.Errorf("duplicate window: got %s, want %s", got, want)
		}
		if err := a.Stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
}

// TestMaxLogBytesReachesStream: --max-log-bytes bounds the event stream,
// and a restart with another bound changes the existing stream's.
func TestMaxLogBytesReachesStream(t *testing.T) {
	dir := t.TempDir()
	for _, want := range []int64{256 << 20, 512 << 20} {
		a := startApp(t, dir, func(c *serveConfig) { c.MaxLogBytes = want })
		info, err := a.store.Stream().Info(t.Context())
		if err != nil {
			t.Fatalf("stream info: %v", err)
		}
		if got := info.Config.MaxBytes; got != want {
			t.Errorf("max bytes: got %d, want %d", got, want)
		}
		if err := a.Stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
}

// TestServeReapsViewsOfThePast: serve removes a view of the past once
// --replay-ttl has passed since it was made.
func TestServeReapsViewsOfThePast(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) { c.ReplayTTL = time.Millisecond })
	js, err := jetstream.New(a.nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "torpor_phases_at_7"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second) // the reaper runs every second at this TTL
	for {
		_, err := js.KeyValue(t.Context(), "torpor_phases_at_7")
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("torpor_phases_at_7 still there (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
