package node

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterBusy: the answers of a cluster still coming up make Start try
// again; any other failure does not.
func TestClusterBusy(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("the clients' copy of torpor_phases: %w", jetstream.ErrJetStreamNotEnabledForAccount), true},
		{fmt.Errorf("the clients' copy of torpor_phases: %w", &jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeJetStreamNotEnabledForAccount, Description: "jetstream not enabled for account"}), true},
		{errors.New("nats: API error: code=503 err_code=10039 description=jetstream not enabled for account"), true},
		{errors.New("insufficient resources: no suitable peers for placement"), true},
		{errors.New("stream name already in use with a different configuration"), false},
	}
	for _, c := range cases {
		if got := clusterBusy(c.err); got != c.want {
			t.Errorf("clusterBusy(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
