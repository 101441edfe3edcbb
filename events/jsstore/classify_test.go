package jsstore

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

func TestClassify(t *testing.T) {
	api := func(status int, code jetstream.ErrorCode) error {
		return &jetstream.APIError{Code: status, ErrorCode: code, Description: "test"}
	}
	tests := []struct {
		name string
		err  error
		want outcome
	}{
		{"wrong last sequence", api(400, 10071), conflict},
		{"wrong last sequence on a replicated stream", api(400, 10164), conflict},
		{"duplicate inside an atomic batch", api(400, 10201), conflict},
		{"duplicate message id in process", api(409, 10158), conflict},
		{"wrapped wrong last sequence", fmt.Errorf("x: %w", api(400, 10071)), conflict},
		{"batch duplicate sentinel", jetstreamext.ErrBatchPublishDuplicateMsgID, conflict},
		{"service unavailable", api(503, 10008), unknown},
		{"timeout", nats.ErrTimeout, unknown},
		{"deadline", context.DeadlineExceeded, unknown},
		{"cancelled", context.Canceled, unknown},
		{"no responders", nats.ErrNoResponders, unknown},
		{"no stream response", jetstream.ErrNoStreamResponse, unknown},
		{"batch ack timed out", fmt.Errorf("batch message 1 ack failed: %w", nats.ErrTimeout), unknown},
		{"atomic publish disabled", api(400, 10174), failed},
		{"message too large", nats.ErrMaxPayload, failed},
		{"anything else", errors.New("boom"), failed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := classify(tc.err); got != tc.want {
				t.Errorf("classify(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}
