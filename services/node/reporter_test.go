package node

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
)

// TestBusReporterRetries: the sim's reporter sends a report again when the
// gateway's answer is not final (an append that failed once: UNAVAILABLE,
// a conflict retried out: ABORTED) until it is taken, and returns a final
// refusal at once. It returned the first error and the sim dropped the
// report.
func TestBusReporterRetries(t *testing.T) {
	srv := natstest.Start(t)
	rep := busReporter(srv.Conn)
	for i, tc := range []struct {
		first events.Code // the first answer; then taken
		sent  int32       // requests wanted
		code  events.Code // Report's error wanted
	}{
		{events.CodeUnavailable, 2, ""},
		{events.CodeAborted, 2, ""},
		{events.CodeInternal, 2, ""},
		{events.CodeFailedPrecondition, 1, events.CodeFailedPrecondition},
		{events.CodeUnauthenticated, 1, events.CodeUnauthenticated},
	} {
		t.Run(string(tc.first), func(t *testing.T) {
			id := fmt.Sprintf("0193b0a4-7c1e-7a4e-9d0e-5f1f0c9e2a1%d", i)
			var sent atomic.Int32
			sub, err := srv.Conn.Subscribe(compute.ReportSubject(id), func(m *nats.Msg) {
				body := []byte(`{"ok":true}`)
				if sent.Add(1) == 1 {
					body, _ = json.Marshal(events.ErrorBody{Error: events.Errorf(tc.first, "answered %s", tc.first)})
				}
				_ = m.Respond(body)
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = rep.Report(ctx, compute.Report{SandboxID: id, Generation: 1, Kind: compute.ReportExited})
			if got := events.CodeOf(err); got != tc.code || sent.Load() != tc.sent {
				t.Fatalf("first answered %s: %v (code %q) after %d requests; want code %q after %d", tc.first, err, got, sent.Load(), tc.code, tc.sent)
			}
		})
	}
}
