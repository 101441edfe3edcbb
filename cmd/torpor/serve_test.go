package main

import (
	"strings"
	"testing"
	"time"
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
