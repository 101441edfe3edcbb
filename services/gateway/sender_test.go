package gateway

import (
	"testing"

	"github.com/torpor/torpor/events"
)

// TestSender: who may command through the clients' account, from the
// request info the nats-server sets.
func TestSender(t *testing.T) {
	for _, c := range []struct {
		name, info, actor string
		code              events.Code
	}{
		{"a producer", `{"kind":"Client","user":"UABC","name_tag":"alice","tags":["role:producer"]}`, "bus:alice", ""},
		{"a producer and dashboard", `{"kind":"Client","user":"UABC","name_tag":"ops","tags":["role:producer","role:dashboard"]}`, "bus:ops", ""},
		{"a producer without a name", `{"kind":"Client","user":"UABC","tags":["role:producer"]}`, "bus:UABC", ""},
		{"a dashboard", `{"kind":"Client","user":"UABC","name_tag":"wall","tags":["role:dashboard"]}`, "", events.CodePermissionDenied},
		{"a push consumer's delivery", `{"kind":"JetStream","acc":"ACLIENTS","server":"torpor"}`, "", events.CodePermissionDenied},
		{"a delivery claiming the producer tag", `{"kind":"JetStream","tags":["role:producer"]}`, "", events.CodePermissionDenied},
		{"not json", `role:producer`, "", events.CodePermissionDenied},
	} {
		t.Run(c.name, func(t *testing.T) {
			actor, err := sender(c.info)
			var got events.Code
			if err != nil {
				got = events.AsError(err).Code
			}
			if got != c.code {
				t.Fatalf("sender: %q %v, want code %q", actor, err, c.code)
			}
			if actor != c.actor {
				t.Errorf("actor %q, want %q", actor, c.actor)
			}
		})
	}
}
