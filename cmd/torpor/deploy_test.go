package main

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestDeployNATSConfig: the shipped nats-server config parses and asks for
// what torpor relies on (JetStream, fsync of every write).
func TestDeployNATSConfig(t *testing.T) {
	opts, err := server.ProcessConfigFile("../../deploy/nats/torpor.conf")
	if err != nil {
		t.Fatalf("deploy/nats/torpor.conf: %v", err)
	}
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
