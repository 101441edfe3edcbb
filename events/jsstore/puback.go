package jsstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// answerTimeout bounds the wait for the answer to a publish, an atomic
// batch or a read from the stream's leader, whatever deadline the caller's
// context has (a create's is 10 s): a log whose leader is gone (an
// election, a lost quorum) answers nothing, and with the read that
// resolves the append (resolveTimeout) an append answers within
// appendBound, UNAVAILABLE when the log could not say, well inside a
// client's timeout (the Go bus SDK's 10 s per attempt is the shortest
// default of the SDKs). A healthy leader answers in milliseconds; an
// answer later than this is resolved by the read, as a lost one is.
const answerTimeout = 3 * time.Second

// appendBound is the longest an append waits on a log that does not
// answer: its publish's answer, then the read that resolves it.
const appendBound = answerTimeout + resolveTimeout

// publish sends msg to the stream and returns the sequence it was stored at
// (a duplicate's answer carries the original sequence), or the server's
// refusal as a *jetstream.APIError, which classify reads. It is
// jetstream.PublishMsg without its JSON decoding of every answer: that
// decoding was a visible share of the service's CPU in the bench (the
// figure is in the README, Performance), and the answer of a stored message
// has one shape. Anything else goes through encoding/json.
func (s *Store) publish(ctx context.Context, msg *nats.Msg) (uint64, error) {
	ctx, cancel := s.inFlight(ctx)
	defer cancel()
	resp, err := s.js.Conn().RequestMsgWithContext(ctx, msg)
	if err != nil {
		if lost := answerLost(ctx); lost != nil {
			return 0, lost
		}
		if errors.Is(err, nats.ErrNoResponders) {
			return 0, fmt.Errorf("%w: %w", jetstream.ErrNoStreamResponse, err)
		}
		return 0, err
	}
	return s.pubAck(resp.Data)
}

// pubAck reads the stream's answer to a publish.
func (s *Store) pubAck(b []byte) (uint64, error) {
	if seq, ok := stored(b, s.ackPrefix); ok {
		return seq, nil
	}
	var ack struct {
		Error  *jetstream.APIError `json:"error,omitempty"`
		Stream string              `json:"stream"`
		Seq    uint64              `json:"seq"`
	}
	if err := json.Unmarshal(b, &ack); err != nil {
		return 0, fmt.Errorf("%w: %q: %w", jetstream.ErrInvalidJSAck, b, err)
	}
	switch {
	case ack.Error != nil:
		return 0, ack.Error
	case ack.Stream != s.cfg.Stream:
		return 0, fmt.Errorf("%w: stored in stream %q, want %q", jetstream.ErrInvalidJSAck, ack.Stream, s.cfg.Stream)
	}
	return ack.Seq, nil
}

// stored reads the sequence of an answer that starts with prefix
// ({"stream":"<name>","seq":) and goes on with digits and then , or }.
func stored(b, prefix []byte) (uint64, bool) {
	if !bytes.HasPrefix(b, prefix) {
		return 0, false
	}
	var seq uint64
	i := len(prefix)
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if seq > (1<<64-1)/10 {
			return 0, false
		}
		seq = seq*10 + uint64(b[i]-'0')
	}
	if i == len(prefix) || i == len(b) || (b[i] != ',' && b[i] != '}') {
		return 0, false
	}
	return seq, true
}

// errConnLost ends a publish whose connection went down, or whose stream
// elected a new leader, while it waited: its answer is lost (it may have
// landed), as after a timeout.
var errConnLost = errors.New("the connection or the stream's leader went away with the request in flight")

// answerLost is the error of a request whose context inFlight ended with
// errConnLost: a timeout (the answer lost, the request may have landed),
// saying why; nil for any other end.
func answerLost(ctx context.Context) error {
	if errors.Is(context.Cause(ctx), errConnLost) {
		return fmt.Errorf("%w: %w", nats.ErrTimeout, errConnLost)
	}
	return nil
}

// inFlight is the context of a publish: ctx, bounded by the store's
// answer timeout (answerTimeout) whatever its own deadline, and ended with
// errConnLost when the connection goes down (a reconnect does not bring the
// answer back) or the stream elects a new leader or loses its quorum
// (watchLeader).
func (s *Store) inFlight(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancelTimeout := context.WithTimeout(ctx, s.answerTimeout)
	c, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.out.current(), func() { cancel(errConnLost) })
	return c, func() { stop(); cancel(nil); cancelTimeout() }
}
