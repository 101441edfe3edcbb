package node

// torpor replay: the server's POST /v1/replay, which rebuilds a view from
// the log (projections/kvview and projections/sqlview, View.Rebuild) and
// streams its progress, and the client verb that asks for it and shows the
// progress.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/projections"
	"github.com/torpor/torpor/projections/kvview"
	"github.com/torpor/torpor/projections/sqlview"
	"github.com/torpor/torpor/services/gateway"
)

// ReplayDeps is what the replay endpoint rebuilds from and into.
type ReplayDeps struct {
	Store *jsstore.Store
	KV    *kvview.View
	// SQL is the SQL view, or an error while its database was never
	// reached (serve's sqlPart.reader); nil: serve runs without
	// --projection-db.
	SQL func() (*sqlview.View, error)
	Log zerolog.Logger
}

// replayRequest is the body of POST /v1/replay. Until is a sequence (a
// number, or a string of digits) or an RFC 3339 time; absent, the view is
// rebuilt and swapped in.
type replayRequest struct {
	View  string          `json:"view"`
	Until json.RawMessage `json:"until,omitempty"`
}

// ReplayLine is one line of the answer (newline-delimited JSON): the
// progress of a phase, then a last line whose phase is "done" (with Seq and
// Target: where the rebuilt view is) or "failed" (with Error).
type ReplayLine struct {
	View      string        `json:"view"`
	Phase     string        `json:"phase"`
	Done      uint64        `json:"done"`
	Total     uint64        `json:"total"`
	Seq       uint64        `json:"seq,omitempty"`
	Target    string        `json:"target,omitempty"`
	Events    int           `json:"events,omitempty"`
	ElapsedMS int64         `json:"elapsed_ms,omitempty"`
	Error     *events.Error `json:"error,omitempty"`
}

// replayEvery is how often a phase's progress goes out at most.
const replayEvery = 200 * time.Millisecond

type replayHandler struct {
	d    ReplayDeps
	busy map[string]*sync.Mutex // one rebuild at a time per view
}

func NewReplayHandler(d ReplayDeps) *replayHandler {
	return &replayHandler{d: d, busy: map[string]*sync.Mutex{"kv": {}, "sql": {}}}
}

// ServeHTTP starts the rebuild and streams its progress. A request that
// cannot start (a malformed body, an unknown view, an until that does not
// parse or is past the log: INVALID_ARGUMENT; sql without a SQL view, a
// rebuild of that view already running: FAILED_PRECONDITION) is answered
// with the contract's error body and status; once the progress streams, a
// failure is its last line. The rebuild ends with the request: a client
// that goes away cancels it, and a cancelled rebuild swaps nothing.
func (h *replayHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req replayRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4096))
	if err == nil && len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err = dec.Decode(&req)
	}
	if err != nil {
		replayError(w, events.Errorf(events.CodeInvalidArgument, "replay: malformed body: %v", err))
		return
	}
	seq, at, err := parseUntil(req.Until)
	if err != nil {
		replayError(w, err)
		return
	}
	mu, ok := h.busy[req.View]
	switch {
	case !ok:
		replayError(w, events.Errorf(events.CodeInvalidArgument, "replay: view %q: want kv or sql", req.View))
		return
	case req.View == "sql" && h.d.SQL == nil:
		replayError(w, events.Errorf(events.CodeFailedPrecondition, "replay: no SQL view: the server runs without --projection-db"))
		return
	case !mu.TryLock():
		replayError(w, events.Errorf(events.CodeFailedPrecondition, "replay: a rebuild of the %s view is running already", req.View))
		return
	}
	// The rebuild is over once its result is in: the lock goes then, before
	// the last line, so that a client that read it may start another at once.
	unlock := sync.OnceFunc(mu.Unlock)
	defer unlock()
	gateway.LongLived(w) // a rebuild may take longer than the write timeout

	// The rebuild reports from its goroutines, the KV swap with the live
	// writer paused: it only keeps the newest progress here, and this
	// goroutine writes it out, so a slow client never holds the rebuild up.
	var (
		pmu    sync.Mutex
		latest ReplayLine
		fresh  bool
	)
	poke := make(chan struct{}, 1)
	progress := func(phase string, done, total uint64) {
		if phase == projections.PhaseDone {
			return // the last line says it, with where the view is
		}
		pmu.Lock()
		changed := phase != latest.Phase
		latest, fresh = ReplayLine{View: req.View, Phase: phase, Done: done, Total: total}, true
		pmu.Unlock()
		if changed || done == total {
			select {
			case poke <- struct{}{}:
			default:
			}
		}
	}
	type result struct {
		line ReplayLine
		err  error
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		line, err := h.rebuild(r.Context(), req.View, seq, at, progress)
		line.View, line.ElapsedMS = req.View, time.Since(start).Milliseconds()
		res <- result{line, err}
	}()

	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	started := false
	emit := func(line ReplayLine) {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		_ = enc.Encode(line)
		if flusher != nil {
			flusher.Flush()
		}
	}
	tick := time.NewTicker(replayEvery)
	defer tick.Stop()
	var sent ReplayLine
	send := func() {
		pmu.Lock()
		line, ok := latest, fresh
		fresh = false
		pmu.Unlock()
		if ok && line != sent {
			emit(line)
			sent = line
		}
	}
	for {
		select {
		case <-poke:
			send()
		case <-tick.C:
			send()
		case out := <-res:
			unlock()
			if out.err != nil {
				e := events.AsError(out.err)
				h.d.Log.Warn().Err(out.err).Str("view", req.View).Msg("replay failed")
				if !started {
					replayError(w, e)
					return
				}
				emit(ReplayLine{View: req.View, Phase: "failed", Done: sent.Done, Total: sent.Total, Error: e})
				return
			}
			send()
			h.d.Log.Info().Str("view", req.View).Uint64("seq", out.line.Seq).Str("target", out.line.Target).
				Int("events", out.line.Events).Int64("elapsed_ms", out.line.ElapsedMS).Msg("replay done")
			emit(out.line)
			return
		}
	}
}

// rebuild runs the rebuild of view and returns its last line.
func (h *replayHandler) rebuild(ctx context.Context, view string, seq uint64, at time.Time, progress func(phase string, done, total uint64)) (ReplayLine, error) {
	if view == "kv" {
		st, err := h.d.KV.Rebuild(ctx, h.d.Store, projections.RebuildOptions{Until: seq, UntilTime: at,
			Progress: func(p projections.Progress) { progress(p.Phase, p.Done, p.Total) }})
		return ReplayLine{Phase: projections.PhaseDone, Done: st.LastSeq, Total: st.LastSeq, Seq: st.LastSeq,
			Target: st.Bucket, Events: st.Events}, err
	}
	sv, err := h.d.SQL()
	if err != nil {
		return ReplayLine{}, err
	}
	st, err := sv.Rebuild(ctx, h.d.Store, projections.RebuildOptions{Until: seq, UntilTime: at,
		Progress: func(p projections.Progress) { progress(p.Phase, p.Done, p.Total) }})
	return ReplayLine{Phase: projections.PhaseDone, Done: st.LastSeq, Total: st.LastSeq, Seq: st.LastSeq,
		Target: st.Sandboxes, Events: st.Events}, err
}

func replayError(w http.ResponseWriter, err error) {
	e := events.AsError(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Code.HTTPStatus())
	_ = json.NewEncoder(w).Encode(events.ErrorBody{Error: e})
}

// parseUntil reads an until: absent or empty, a sequence (JSON number or
// digits), or an RFC 3339 time. Anything else is INVALID_ARGUMENT.
func parseUntil(raw json.RawMessage) (uint64, time.Time, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return 0, time.Time{}, nil
	}
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, time.Time{}, events.Errorf(events.CodeInvalidArgument, "until %s: %v", raw, err)
		}
	}
	return UntilOf(s)
}

// UntilOf reads the until of the request or of the --until flag.
func UntilOf(s string) (uint64, time.Time, error) {
	if s == "" {
		return 0, time.Time{}, nil
	}
	if seq, err := strconv.ParseUint(s, 10, 64); err == nil {
		if seq == 0 {
			return 0, time.Time{}, events.Errorf(events.CodeInvalidArgument, "until 0: the log starts at 1")
		}
		return seq, time.Time{}, nil
	}
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, time.Time{}, events.Errorf(events.CodeInvalidArgument, "until %q: want a sequence number or an RFC 3339 time", s)
	}
	return 0, at, nil
}
