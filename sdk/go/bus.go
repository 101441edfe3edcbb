package torpor

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// Bus is the client of torpor on NATS (CONTRACT §4): the commands as
// request/reply on torpor.cmd.<verb>, the reads from the KV bucket
// torpor_phases (the phase view) and the stream TORPOR_EVENTS (the
// history). It is safe for concurrent use. The connection is the caller's:
// Bus never closes it, and rides out its reconnects.
//
// What the bus has no subject for (drivers, logs, forwards, a sandbox by
// name, a view at a past point) is on the HTTP client only.
type Bus struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	bucket  string
	stream  string
	timeout time.Duration
	actor   string
	// known is the highest seq this Bus has seen of each sandbox (in a
	// command's answer or a view it read), for reading its own writes.
	known *seen
}

// seen is the highest seq seen of each sandbox, for at most seenMax of
// them (the oldest forgotten first).
type seen struct {
	mu    sync.Mutex
	seq   map[string]uint64
	order []string
}

// seenMax bounds what a Bus remembers of the sandboxes it saw.
const seenMax = 4096

func (s *seen) put(id string, seq uint64) {
	if id == "" || seq == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.seq[id]
	if !ok {
		if len(s.order) >= seenMax {
			delete(s.seq, s.order[0])
			s.order = s.order[1:]
		}
		s.order = append(s.order, id)
	}
	s.seq[id] = max(old, seq)
}

func (s *seen) get(id string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seq[id]
}

// BusOption configures a Bus.
type BusOption func(*Bus)

// WithBucket reads the phase view from KV bucket name instead of
// torpor_phases (a service run with another bucket).
func WithBucket(name string) BusOption { return func(b *Bus) { b.bucket = name } }

// WithStream reads the history from stream name instead of TORPOR_EVENTS.
func WithStream(name string) BusOption { return func(b *Bus) { b.stream = name } }

// WithRequestTimeout bounds each attempt of a command (default 10s): one
// that got no reply by then is sent again, with the same key, while ctx
// lasts and attempts remain. 0: ctx alone bounds an attempt.
func WithRequestTimeout(d time.Duration) BusOption { return func(b *Bus) { b.timeout = d } }

// WithActor sets the actor the commands are recorded with (header
// Torpor-Actor; the service's default is "bus").
func WithActor(actor string) BusOption { return func(b *Bus) { b.actor = actor } }

// Bus headers and defaults (CONTRACT §4).
const (
	HeaderIdempotencyKey = "Torpor-Idempotency-Key"
	HeaderActor          = "Torpor-Actor"
	DefaultBucket        = "torpor_phases"
	DefaultStream        = "TORPOR_EVENTS"
	// CommandSubjectPrefix + verb is the subject of a command.
	CommandSubjectPrefix = "torpor.cmd."
	// SandboxSubjectPrefix + id is the subject of a sandbox's events.
	SandboxSubjectPrefix = "torpor.sandbox."
)

// NewBus returns the bus client on nc.
func NewBus(nc *nats.Conn, opts ...BusOption) (*Bus, error) {
	if nc == nil {
		return nil, events.Errorf(events.CodeInvalidArgument, "torpor.NewBus: no connection")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, events.Errorf(events.CodeInvalidArgument, "torpor.NewBus: %v", err)
	}
	b := &Bus{nc: nc, js: js, bucket: DefaultBucket, stream: DefaultStream, timeout: 10 * time.Second, known: &seen{seq: map[string]uint64{}}}
	for _, o := range opts {
		o(b)
	}
	return b, nil
}

// busRequest is the body of a command other than create: the HTTP body
// plus the sandbox's id.
type busRequest struct {
	ID                    string `json:"id"`
	RestartIfRestoreFails bool   `json:"restart_if_restore_fails,omitempty"`
	Node                  string `json:"node,omitempty"`
}

// command sends body on torpor.cmd.<verb> with idempotency key key (or a
// fresh one), again with the same key after no answer or an UNAVAILABLE or
// ABORTED one.
func (b *Bus) command(ctx context.Context, verb string, body any, key string) (events.View, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return events.View{}, events.Errorf(events.CodeInvalidArgument, "%s: encode body: %v", verb, err)
	}
	msg := &nats.Msg{Subject: CommandSubjectPrefix + verb, Data: data, Header: nats.Header{}}
	msg.Header.Set(HeaderIdempotencyKey, orKey(key))
	if b.actor != "" {
		msg.Header.Set(HeaderActor, b.actor)
	}
	v, err := retry(ctx, func() (events.View, error) { return b.request(ctx, verb, msg) })
	if err == nil {
		b.known.put(v.ID, v.Seq)
	}
	return v, err
}

// request sends msg once and decodes the answer.
func (b *Bus) request(ctx context.Context, verb string, msg *nats.Msg) (events.View, error) {
	rctx := ctx
	if b.timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, b.timeout)
		defer cancel()
	}
	// A copy per attempt: the library sets the reply subject on it.
	m := &nats.Msg{Subject: msg.Subject, Data: msg.Data, Header: msg.Header}
	reply, err := b.nc.RequestMsgWithContext(rctx, m)
	if err != nil {
		return events.View{}, transportError(ctx, msg.Subject, err)
	}
	return decodeAnswer(reply.Data, verb)
}

// decodeAnswer decodes a command's reply: a view, or {"error":…}.
func decodeAnswer(data []byte, what string) (events.View, error) {
	var a struct {
		events.View
		Error *events.Error `json:"error"`
	}
	if err := json.Unmarshal(data, &a); err != nil {
		return events.View{}, events.Errorf(events.CodeInternal, "%s: decode answer: %v", what, err)
	}
	if a.Error != nil {
		return events.View{}, a.Error
	}
	return a.View, nil
}

// Create creates a sandbox; key is its idempotency key ("" makes one, which
// the client's own retries reuse).
func (b *Bus) Create(ctx context.Context, r CreateRequest, key string) (events.View, error) {
	return b.command(ctx, VerbCreate, r, key)
}

// Lifecycle sends verb (start, stop, suspend, resume or delete) to sandbox
// id; key is the idempotency key ("" makes one).
func (b *Bus) Lifecycle(ctx context.Context, verb, id string, restartIfRestoreFails bool, key string) (events.View, error) {
	return b.command(ctx, verb, busRequest{ID: id, RestartIfRestoreFails: restartIfRestoreFails}, key)
}

// Start starts a stopped (or suspended) sandbox.
func (b *Bus) Start(ctx context.Context, id string) (events.View, error) {
	return b.Lifecycle(ctx, VerbStart, id, false, "")
}

// Stop stops a ready sandbox.
func (b *Bus) Stop(ctx context.Context, id string) (events.View, error) {
	return b.Lifecycle(ctx, VerbStop, id, false, "")
}

// Suspend suspends a ready sandbox.
func (b *Bus) Suspend(ctx context.Context, id string) (events.View, error) {
	return b.Lifecycle(ctx, VerbSuspend, id, false, "")
}

// Resume resumes a suspended sandbox with options o; key is the
// idempotency key ("" makes one).
func (b *Bus) Resume(ctx context.Context, id string, o ResumeOptions, key string) (events.View, error) {
	return b.command(ctx, VerbResume, busRequest{ID: id, RestartIfRestoreFails: o.RestartIfRestoreFails, Node: o.Node}, key)
}

// Touch records activity of sandbox id, as Client.Touch does, on
// torpor.cmd.touch; key is the idempotency key ("" makes one).
func (b *Bus) Touch(ctx context.Context, id, key string) (events.View, error) {
	return b.command(ctx, VerbTouch, busRequest{ID: id}, key)
}

// Delete deletes a sandbox; key is the idempotency key ("" makes one).
func (b *Bus) Delete(ctx context.Context, id, key string) (events.View, error) {
	return b.Lifecycle(ctx, VerbDelete, id, false, key)
}

// kv is the phase view's bucket.
func (b *Bus) kv(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := b.js.KeyValue(ctx, b.bucket)
	if err != nil {
		return nil, b.jsError(ctx, "bucket "+b.bucket, err)
	}
	return kv, nil
}

// jsError maps an error of a JetStream call to its contract code.
func (b *Bus) jsError(ctx context.Context, what string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return events.Errorf(events.CodeUnavailable, "%s: %v (is torpor serving on this NATS?)", what, err)
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted), errors.Is(err, jetstream.ErrMsgNotFound):
		return events.Errorf(events.CodeNotFound, "%s: not found", what)
	case errors.Is(err, jetstream.ErrInvalidKey):
		return events.Errorf(events.CodeInvalidArgument, "%s: %v", what, err)
	}
	return transportError(ctx, what, err)
}

// Get returns the view of sandbox id (by id: the bus has no index of
// names) from the bucket. The view follows the log by a moment: right
// after a create it may not be there yet (NOT_FOUND); Wait waits for it.
func (b *Bus) Get(ctx context.Context, id string) (events.View, error) {
	if !viewKey(id) {
		return events.View{}, events.Errorf(events.CodeNotFound, "sandbox %q: not found", id)
	}
	kv, err := b.kv(ctx)
	if err != nil {
		return events.View{}, err
	}
	for {
		e, err := kv.Get(ctx, id)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return events.View{}, b.jsError(ctx, "sandbox "+id, err)
		}
		var v events.View
		if err == nil {
			if v, err = decodeView(e.Key(), e.Value()); err != nil {
				return v, err
			}
		}
		// The bucket a client reads is a copy that follows the service's
		// by a moment: a sandbox this Bus saw at a later seq (its own
		// command's answer) is read again until the copy has caught up.
		if known := b.known.get(id); known == 0 || v.Seq >= known {
			if v.Seq == 0 {
				return v, b.jsError(ctx, "sandbox "+id, jetstream.ErrKeyNotFound)
			}
			b.known.put(id, v.Seq)
			return v, nil
		}
		if err := sleep(ctx, copyPoll); err != nil {
			return v, transportError(ctx, "sandbox "+id, err)
		}
	}
}

// copyPoll is how often a read of a copy behind what this Bus saw looks
// again.
const copyPoll = 5 * time.Millisecond

// caughtUp waits until the stream's copy holds the log up to seq (a
// copy keeps its origin's sequences).
func (b *Bus) caughtUp(ctx context.Context, s jetstream.Stream, seq uint64) error {
	for {
		info, err := s.Info(ctx)
		if err != nil {
			return b.jsError(ctx, "stream "+b.stream, err)
		}
		if info.State.LastSeq >= seq {
			return nil
		}
		if err := sleep(ctx, copyPoll); err != nil {
			return transportError(ctx, "stream "+b.stream, err)
		}
	}
}

// viewKey reports whether key can be a sandbox's: a valid KV key without
// dots (the bucket's other keys, a checkpoint's, have dots).
func viewKey(key string) bool {
	return key != "" && !strings.ContainsAny(key, ". *>\t\r\n")
}

// decodeView decodes a view from the bucket. A phase this SDK does not
// know is kept as it is.
func decodeView(key string, data []byte) (events.View, error) {
	var v events.View
	if err := json.Unmarshal(data, &v); err != nil {
		return events.View{}, events.Errorf(events.CodeInternal, "view %s: decode: %v", key, err)
	}
	return v, nil
}

// Wait returns the view of sandbox id once it is in phase, as long as ctx
// lasts; FAILED_PRECONDITION (with the view) once it is in a terminal phase
// other than phase. It waits on a KV watch of the sandbox's key, which
// rides out the connection's reconnects.
func (b *Bus) Wait(ctx context.Context, id string, phase events.Phase) (events.View, error) {
	return b.WaitAfter(ctx, id, phase, 0)
}

// WaitAfter is Wait for a view at a sequence above after: pass the sequence
// a command answered with, so that the view from before it does not count.
func (b *Bus) WaitAfter(ctx context.Context, id string, phase events.Phase, after uint64) (events.View, error) {
	if !viewKey(id) {
		return events.View{}, events.Errorf(events.CodeNotFound, "sandbox %q: not found", id)
	}
	kv, err := b.kv(ctx)
	if err != nil {
		return events.View{}, err
	}
	var last events.View
	for {
		w, err := kv.Watch(ctx, id, jetstream.IgnoreDeletes())
		if err != nil {
			if ctx.Err() != nil {
				return last, transportError(ctx, "wait for "+id, err)
			}
			if serr := sleep(ctx, minBackoff); serr != nil {
				return last, transportError(ctx, "wait for "+id, serr)
			}
			continue
		}
		v, done, err := b.waitOn(ctx, w, id, phase, after, &last)
		_ = w.Stop()
		if done {
			return v, err
		}
		// The watch closed under us: watch again (its first value is the
		// current one, so nothing in between is missed).
		if serr := sleep(ctx, minBackoff); serr != nil {
			return last, transportError(ctx, "wait for "+id, serr)
		}
	}
}

// waitOn reads one watch of id's key; done is false if the watch closed.
func (b *Bus) waitOn(ctx context.Context, w jetstream.KeyWatcher, id string, phase events.Phase, after uint64, last *events.View) (events.View, bool, error) {
	checked := false
	for {
		select {
		case <-ctx.Done():
			return *last, true, events.Errorf(codeOfCtx(ctx), "sandbox %s did not reach %s (it is %q): %w", id, phase, last.Phase, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return *last, false, nil
			}
			if e == nil {
				// The current value, if any, is in. None: a sandbox not
				// yet projected, or none at all, which the log tells.
				if last.Seq == 0 && !checked {
					checked = true
					if err := b.exists(ctx, id); err != nil {
						return *last, true, err
					}
				}
				continue
			}
			v, err := decodeView(e.Key(), e.Value())
			if err != nil {
				return *last, true, err
			}
			if v.Seq < last.Seq {
				continue // a view never goes back
			}
			*last = v
			b.known.put(id, v.Seq)
			switch {
			case v.Seq <= after:
			case v.Phase == phase:
				return v, true, nil
			case v.Phase.Terminal():
				return v, true, events.Errorf(events.CodeFailedPrecondition, "sandbox %s is %s; it will never be %s", id, v.Phase, phase)
			}
		}
	}
}

// codeOfCtx is DEADLINE_EXCEEDED if ctx's deadline passed, else UNAVAILABLE.
func codeOfCtx(ctx context.Context) events.Code {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return events.CodeDeadlineExceeded
	}
	return events.CodeUnavailable
}

// exists answers NOT_FOUND when the log holds no event of sandbox id.
func (b *Bus) exists(ctx context.Context, id string) error {
	if b.known.get(id) > 0 {
		return nil // a command answered with it
	}
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return b.jsError(ctx, "stream "+b.stream, err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, SandboxSubjectPrefix+id); err != nil {
		return b.jsError(ctx, "sandbox "+id, err)
	}
	return nil
}

// Watch streams view changes from a KV watch of the bucket: first the
// current view of every sandbox whose seq is above after, then every change,
// calling fn with each in the order the bucket stored them. The watch rides
// out the connection's reconnects (and is made again should it close); a
// view whose seq is at or below one already delivered for the same sandbox
// is dropped, so that none is delivered twice. It returns ctx.Err() once ctx
// ends and fn's error as soon as fn returns one.
func (b *Bus) Watch(ctx context.Context, after uint64, fn func(events.View) error) error {
	seen := map[string]uint64{}
	for {
		err := b.watchOnce(ctx, after, seen, fn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return err
		}
		if err := sleep(ctx, minBackoff); err != nil {
			return err
		}
	}
}

// watchOnce reads one watch of the bucket until it closes (nil) or fn
// fails (fn's error).
func (b *Bus) watchOnce(ctx context.Context, after uint64, seen map[string]uint64, fn func(events.View) error) error {
	kv, err := b.kv(ctx)
	if err != nil {
		return nil // not there yet, or no connection: try again
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil || !viewKey(e.Key()) {
				continue
			}
			v, err := decodeView(e.Key(), e.Value())
			if err != nil || v.Seq <= after || v.Seq <= seen[v.ID] {
				continue // a value this client cannot read is no change to show
			}
			if err := fn(v); err != nil {
				return err
			}
			seen[v.ID] = v.Seq
		}
	}
}

// scan calls each with the current view of every sandbox in the bucket.
func (b *Bus) scan(ctx context.Context, each func(events.View)) error {
	kv, err := b.kv(ctx)
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return b.jsError(ctx, "bucket "+b.bucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return transportError(ctx, "bucket "+b.bucket, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return events.Errorf(events.CodeUnavailable, "bucket %s: the watch closed", b.bucket)
			}
			if e == nil {
				return nil
			}
			if !viewKey(e.Key()) {
				continue
			}
			if v, err := decodeView(e.Key(), e.Value()); err == nil {
				each(v)
			}
		}
	}
}

// List lists sandboxes from the bucket, in creation order (by id, a uuid
// v7); phase and label ("k=v") filter when set, limit (default 100, at
// most 1000) bounds the page and cursor is the Next of the page before. It
// reads the whole bucket for each page: for a large fleet, list over HTTP.
// The page's Total is how many sandboxes match over all pages.
func (b *Bus) List(ctx context.Context, phase, label string, limit int, cursor string) (Page, error) {
	lk, lv, hasLabel := strings.Cut(label, "=")
	if label != "" && (!hasLabel || lk == "") {
		return Page{}, events.Errorf(events.CodeInvalidArgument, "label %q: want key=value", label)
	}
	if limit == 0 {
		limit = 100
	}
	if limit < 1 || limit > 1000 {
		return Page{}, events.Errorf(events.CodeInvalidArgument, "limit %d: want 1 to 1000", limit)
	}
	var after string
	if cursor != "" {
		raw, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || !viewKey(string(raw)) {
			return Page{}, events.Errorf(events.CodeInvalidArgument, "cursor %q: not a cursor of this list", cursor)
		}
		after = string(raw)
	}
	var all []events.View
	total := 0 // the matches over all pages
	err := b.scan(ctx, func(v events.View) {
		if phase != "" && string(v.Phase) != phase {
			return
		}
		if val, ok := v.Labels[lk]; label != "" && (!ok || val != lv) {
			return
		}
		if v.ID <= after {
			total++ // a match on a page before
			return
		}
		all = append(all, v)
	})
	if err != nil {
		return Page{}, err
	}
	total += len(all)
	slices.SortFunc(all, func(x, y events.View) int { return strings.Compare(x.ID, y.ID) })
	page := Page{Items: []events.View{}, Total: total}
	if len(all) > limit {
		all = all[:limit]
		page.Next = base64.RawURLEncoding.EncodeToString([]byte(all[limit-1].ID))
	}
	page.Items = append(page.Items, all...)
	return page, nil
}

// Phases returns the count of sandboxes per phase in the bucket (every
// phase of the contract, 0 when none is in it, and any other phase found).
func (b *Bus) Phases(ctx context.Context) (map[events.Phase]int, error) {
	counts := make(map[events.Phase]int, len(events.Phases))
	for _, p := range events.Phases {
		counts[p] = 0
	}
	if err := b.scan(ctx, func(v events.View) { counts[v.Phase]++ }); err != nil {
		return nil, err
	}
	return counts, nil
}

// History returns the audit history of sandbox id after seq, read from
// the log (the stream's subject of the sandbox): NOT_FOUND when the log
// holds none of its events. A message that is no torpor event is skipped
// (CONTRACT §4).
func (b *Bus) History(ctx context.Context, id string, after uint64) ([]Event, error) {
	if !viewKey(id) {
		return nil, events.Errorf(events.CodeNotFound, "sandbox %q: not found", id)
	}
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return nil, b.jsError(ctx, "stream "+b.stream, err)
	}
	if known := b.known.get(id); known > 0 {
		if err := b.caughtUp(ctx, s, known); err != nil {
			return nil, err
		}
	}
	subject := SandboxSubjectPrefix + id
	head, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		return nil, b.jsError(ctx, "sandbox "+id, err)
	}
	out := []Event{}
	if head.Sequence <= after {
		return out, nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    after + 1,
	})
	if err != nil {
		return nil, b.jsError(ctx, "history of "+id, err)
	}
	for {
		batch, err := c.Fetch(256, jetstream.FetchMaxWait(b.timeout))
		if err != nil {
			return nil, b.jsError(ctx, "history of "+id, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			if env, err := events.DecodeEnvelope(m.Data()); err == nil && env.SandboxID == id {
				env.Seq = md.Sequence.Stream
				out = append(out, env.HistoryEntry())
			}
			if md.Sequence.Stream >= head.Sequence {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil {
			return nil, b.jsError(ctx, "history of "+id, err)
		}
		if n == 0 {
			return nil, events.Errorf(events.CodeUnavailable, "history of %s: the log gave nothing up to seq %d", id, head.Sequence)
		}
	}
}
