package jsstore

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestPubAck: every shape of the stream's answer to a publish reads as
// jetstream.PublishMsg would read it.
func TestPubAck(t *testing.T) {
	s := &Store{cfg: Config{Stream: "TORPOR_EVENTS"}, ackPrefix: []byte(`{"stream":"TORPOR_EVENTS","seq":`)}
	ok := []struct {
		answer string
		seq    uint64
	}{
		{`{"stream":"TORPOR_EVENTS","seq":1}`, 1},
		{`{"stream":"TORPOR_EVENTS","seq":18446744073709551615}`, 1<<64 - 1},
		{`{"stream":"TORPOR_EVENTS","seq":42,"duplicate":true}`, 42},
		{`{"stream":"TORPOR_EVENTS","seq":7,"domain":"hub"}`, 7},
		{`{"stream":"TORPOR_EVENTS", "seq": 9}`, 9}, // not the fast shape: encoding/json
		{`{"seq":11,"stream":"TORPOR_EVENTS"}`, 11},
	}
	for _, c := range ok {
		seq, err := s.pubAck([]byte(c.answer))
		if err != nil || seq != c.seq {
			t.Errorf("pubAck(%s) = %d, %v; want %d", c.answer, seq, err, c.seq)
		}
	}
	refused := `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"TORPOR_EVENTS","seq":0}`
	_, err := s.pubAck([]byte(refused))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != codeWrongLastSequence || classify(err) != conflict {
		t.Errorf("pubAck(refusal) = %v; want the APIError 10071, classified as a conflict", err)
	}
	for _, bad := range []string{``, `not json`, `{"stream":"OTHER","seq":3}`, `{"stream":"TORPOR_EVENTS","seq":}`, `{"stream":"TORPOR_EVENTS","seq":99999999999999999999}`} {
		if seq, err := s.pubAck([]byte(bad)); err == nil {
			t.Errorf("pubAck(%q) = %d, nil; want an error", bad, seq)
		}
	}
}
