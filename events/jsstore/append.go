package jsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// resolveTimeout bounds the read that decides whether an ambiguous append
// landed, whether or not the caller's context has ended: the leader that
// is there answers it in milliseconds.
const resolveTimeout = time.Second

// Append stores envs on the subject of sandbox id if its last sequence is
// expected: one envelope as one message, several as one atomic batch (at
// most the server's batch limit, 1000 by default). Each message carries the
// envelope's DedupID as Nats-Msg-Id and its type in HeaderType.
//
// Cost: nats-server stages every atomic batch of a one-replica file-backed
// stream in a file store of its own, created, synced and deleted per batch
// (server/jetstream_batching.go, newBatchStore), so even a two-event batch
// takes many times as long as a single append (the figures are in the
// README, Choices: "Atomic batches only where they matter"). Callers append
// events that stand alone one at a time, and keep batches for outcomes that
// must not be seen half written.
//
// With Config.GroupCommit, appends in flight at once may share one atomic
// batch, and so one sync (group commit, group.go); each keeps its
// per-subject check and its error, as if it had gone alone.
//
// An answer that leaves the outcome open (wrong last sequence, duplicate
// inside a batch, timeout, no responders) is resolved by reading the
// subject's last message from the stream leader: if it carries the message
// id of our last envelope, the append landed and its sequence is returned.
// Otherwise a sequence mismatch wraps events.ErrConflict and a lost answer
// wraps events.ErrUnavailable (the append may then be retried as is).
func (s *Store) Append(ctx context.Context, id string, expected uint64, envs ...events.Envelope) (uint64, error) {
	if err := events.CheckAppend(id, envs); err != nil {
		return 0, fmt.Errorf("append %s: %w", id, err)
	}
	subject := Subject(id)
	msgs := make([]*nats.Msg, len(envs))
	for i, env := range envs {
		body, err := env.AppendJSON(make([]byte, 0, 512))
		if err != nil {
			return 0, fmt.Errorf("append %s: encode %s: %w", id, env.Type, err)
		}
		msgs[i] = &nats.Msg{Subject: subject, Data: body, Header: nats.Header{
			jetstream.MsgIDHeader: []string{env.DedupID()},
			HeaderType:            []string{env.Type},
		}}
	}
	msgs[0].Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expected, 10))
	if !s.cfg.GroupCommit {
		return s.appendNow(ctx, id, expected, envs, msgs)
	}
	return s.group.append(ctx, s, &member{ctx: ctx, id: id, expected: expected, envs: envs, msgs: msgs})
}

// appendNow stores msgs, the messages of envs, on their own: one message
// as a publish, several as an atomic batch; an open answer is resolved.
func (s *Store) appendNow(ctx context.Context, id string, expected uint64, envs []events.Envelope, msgs []*nats.Msg) (uint64, error) {
	var err error
	op := s.out.begin(time.Now())
	defer func() { s.out.end(op, time.Now(), errors.Is(err, events.ErrUnavailable)) }()
	if len(msgs) == 1 {
		var seq uint64
		if seq, err = s.publish(ctx, msgs[0]); err == nil {
			return seq, nil // a duplicate's answer carries the original sequence
		}
	} else {
		var ack *jetstreamext.BatchAck
		bctx, cancel := s.inFlight(ctx)
		ack, err = jetstreamext.PublishMsgBatch(bctx, s.js, msgs)
		if lost := answerLost(bctx); err != nil && lost != nil {
			err = lost
		}
		cancel()
		if err == nil {
			return ack.Sequence, nil
		}
	}
	var seq uint64
	seq, err = s.resolve(ctx, id, expected, envs, err)
	return seq, err
}

// resolve is the outcome of an append whose publish answered err.
func (s *Store) resolve(ctx context.Context, id string, expected uint64, envs []events.Envelope, err error) (uint64, error) {
	subject := Subject(id)

	if full(err) {
		return 0, events.Errorf(events.CodeResourceExhausted, "append %s: the event log is full (%v); free storage or raise --max-log-bytes", id, err)
	}
	outcome := classify(err)
	if outcome == failed {
		return 0, fmt.Errorf("append %s: %w", id, err)
	}
	if outcome == unknown && !s.js.Conn().IsConnected() {
		// Nothing can be read back now; the caller retries with the same ids.
		return 0, fmt.Errorf("append %s: %w: %w", id, events.ErrUnavailable, err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	seq, msgID, rerr := s.lastOf(rctx, subject)
	if rerr == nil && msgID == envs[len(envs)-1].DedupID() {
		return seq, nil
	}
	switch {
	case outcome == conflict:
		return 0, fmt.Errorf("append %s at %d: %w: %w", id, expected, events.ErrConflict, err)
	case rerr != nil:
		return 0, fmt.Errorf("append %s: %w: %w (and reading the last event: %w)", id, events.ErrUnavailable, err, rerr)
	default:
		return 0, fmt.Errorf("append %s: %w: %w", id, events.ErrUnavailable, err)
	}
}

// outcome is what a failed publish says about whether it landed.
type outcome int

const (
	failed   outcome = iota // it did not land: return the error
	conflict                // the subject moved, or a duplicate: it may be ours
	unknown                 // the answer was lost: it may have landed
)

// Error codes of the server this store reads.
const (
	codeWrongLastSequence         = jetstream.JSErrCodeStreamWrongLastSequence         // 10071
	codeWrongLastSequenceConstant = jetstream.JSErrCodeStreamWrongLastSequenceConstant // 10164, replicated streams
	codeBatchDuplicateMsgID       = jetstreamext.JSErrCodeBatchPublishDuplicateMsgID   // 10201
	codeDuplicateMsgConflict      = 10158                                              // duplicate message id is in process
)

// Codes of a server that refuses to store: a stream at its MaxBytes (or
// MaxMsgs) with DiscardNew answers 10077 with the store's error, a server
// or account out of storage 10023, 10047 or 10028.
const (
	codeStoreFailed     = 10077
	codeInsufficient    = 10023
	codeStorageExceeded = 10047
	codeMemoryExceeded  = 10028
)

// full reports whether err is the server refusing an append for want of
// storage: not a failure of the server, a limit reached (RESOURCE_EXHAUSTED).
func full(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case codeInsufficient, codeStorageExceeded, codeMemoryExceeded:
		return true
	case codeStoreFailed:
		d := apiErr.Description
		return strings.Contains(d, "maximum bytes exceeded") || strings.Contains(d, "maximum messages exceeded")
	}
	return false
}

func classify(err error) outcome {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case codeWrongLastSequence, codeWrongLastSequenceConstant, codeBatchDuplicateMsgID, codeDuplicateMsgConflict:
			return conflict
		}
		if apiErr.Code == 503 {
			return unknown
		}
		return failed
	}
	if natserr.Is(err) {
		return unknown
	}
	return failed
}

// lastOf reads the last message of subject through the stream leader (the
// STREAM.MSG.GET API, not a direct get that a lagging replica may answer)
// and returns its sequence and message id; zero values when the subject is
// empty.
func (s *Store) lastOf(ctx context.Context, subject string) (uint64, string, error) {
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return 0, "", err
	}
	ctx, cancel := s.inFlight(ctx) // bounded, and ended when the connection goes down
	defer cancel()
	msg, err := s.js.Conn().RequestWithContext(ctx, s.apiPrefix()+"STREAM.MSG.GET."+s.cfg.Stream, req)
	if err != nil {
		if lost := answerLost(ctx); lost != nil {
			return 0, "", lost
		}
		return 0, "", err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Sequence uint64 `json:"seq"`
			Header   []byte `json:"hdrs,omitempty"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, "", fmt.Errorf("decode last message of %s: %w", subject, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, "", nil
	case resp.Error != nil:
		return 0, "", resp.Error
	case resp.Message == nil:
		return 0, "", fmt.Errorf("last message of %s: empty answer", subject)
	}
	var msgID string
	if len(resp.Message.Header) > 0 {
		hdr, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return 0, "", fmt.Errorf("decode headers of %s at %d: %w", subject, resp.Message.Sequence, err)
		}
		msgID = hdr.Get(jetstream.MsgIDHeader)
	}
	return resp.Message.Sequence, msgID, nil
}

// apiPrefix is the JetStream API prefix of s.js, with its trailing dot.
func (s *Store) apiPrefix() string {
	o := s.js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		if o.APIPrefix[len(o.APIPrefix)-1] != '.' {
			return o.APIPrefix + "."
		}
		return o.APIPrefix
	default:
		return "$JS.API."
	}
}
