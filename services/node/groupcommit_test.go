package node

import "testing"

// TestGroupCommit: the log's appends share their syncs on the embedded
// server when it syncs every write, and only then: with the interval sync
// appends go as they did, and a server of --nats-url keeps a sync setting
// the node does not know.
func TestGroupCommit(t *testing.T) {
	tests := []struct {
		fsync, natsURL string
		want           bool
	}{
		{"always", "", true},
		{"interval", "", false},
		{"always", "nats://127.0.0.1:4222", false},
		{"interval", "nats://127.0.0.1:4222", false},
	}
	for _, tc := range tests {
		if got := groupCommit(Config{Fsync: tc.fsync, NATSURL: tc.natsURL}); got != tc.want {
			t.Errorf("groupCommit(--fsync %s, --nats-url %q) = %v, want %v", tc.fsync, tc.natsURL, got, tc.want)
		}
	}
}
