package natserr_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// TestClassify: what a client is told of a NATS failure. A JetStream API
// error 503 (what a server that lost its store answers while it catches
// up: TestClusterFaults/d saw a wait answer INTERNAL for it) is the bus not
// answering, UNAVAILABLE, which clients retry; a 404 or a 400 is not.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want events.Code
	}{
		{"jetstream 503", fmt.Errorf("head of x: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), events.CodeUnavailable},
		{"legacy 503", fmt.Errorf("head of x: %w", &nats.APIError{Code: 503, ErrorCode: 10039, Description: "jetstream not enabled"}), events.CodeUnavailable},
		{"timeout", fmt.Errorf("append: %w", nats.ErrTimeout), events.CodeUnavailable},
		{"jetstream 404", fmt.Errorf("get: %w", &jetstream.APIError{Code: 404, ErrorCode: 10037, Description: "no message found"}), events.CodeInternal},
		{"jetstream 400", fmt.Errorf("put: %w", &jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence"}), events.CodeInternal},
		{"other", errors.New("disk on fire"), events.CodeInternal},
	} {
		if got := events.CodeOf(natserr.Classify(tc.err)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
