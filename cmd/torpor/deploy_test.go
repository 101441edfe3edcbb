package main

import (
	"testing"
)

// TestDeployNATSConfig: the shipped nats-server config parses, with the
// auth.conf `torpor creds --server-config` writes beside it, and asks for
// what torpor relies on (JetStream, fsync of every write, torpor's
// operator).
func TestDeployNATSConfig(t *testing.T) {
	opts := deployNATSOptions(t, t.TempDir())
	if !opts.JetStream {
		t.Error("JetStream is off")
	}
	if !opts.SyncAlways {
		t.Error("sync_interval is not always: the durable default is every write fsynced")
	}
	if opts.Host != "127.0.0.1" || opts.Port != 4222 {
		t.Errorf("listen %s:%d, want 127.0.0.1:4222", opts.Host, opts.Port)
	}
}
