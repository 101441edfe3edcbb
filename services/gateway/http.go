package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// HTTP serves the API of CONTRACT §5 over a Service and a Views projection.
type HTTP struct {
	svc      *Service
	views    Views
	ready    func(context.Context) error
	log      zerolog.Logger
	mux      *http.ServeMux
	forwards Forwards
	lags     func(context.Context) map[string]uint64
	guard    HTTPGuard
	quotas   quotas
	quota    SandboxQuota
	// watches and waits count those served now (Limits.Watches, .Waits).
	watches, waits atomic.Int64
}

// admit counts one more long-lived request on n, or refuses it at once,
// RESOURCE_EXHAUSTED, when limit are served already; release undoes it.
func admit(n *atomic.Int64, limit int, what string) (release func(), err error) {
	if n.Add(1) > int64(limit) {
		n.Add(-1)
		return nil, events.Errorf(events.CodeResourceExhausted, "this server serves %d %s at once, its limit; retry later", limit, what)
	}
	return func() { n.Add(-1) }, nil
}

// Forwards serves TCP forwards (forward.Forwarder does): the HTTP API binds
// a forward's listener first, so that the event that opens it names the
// address bound, and serves it once the event is in the log.
type Forwards interface {
	// Bind listens on listen for forward fid to port of sandbox id, after
	// dialling the port once when probe is set, and returns the address.
	Bind(ctx context.Context, id, fid, listen string, port int, probe bool) (string, error)
	// Serve serves a bound forward; Close ends one, bound or served.
	Serve(fid string)
	Close(fid string)
}

// WithForwards serves the forwards endpoints through f.
func (h *HTTP) WithForwards(f Forwards) *HTTP {
	h.forwards = f
	return h
}

// WithLags has /readyz report, when ready, how many events of the log each
// view has yet to apply, by the view's name, as lags answers.
func (h *HTTP) WithLags(lags func(context.Context) map[string]uint64) *HTTP {
	h.lags = lags
	return h
}

// WithMetrics serves GET /metrics from m (the Prometheus text of
// internal/metrics' Set).
func (h *HTTP) WithMetrics(m http.Handler) *HTTP {
	h.mux.Handle("GET /metrics", h.authorize(scopeMetrics, m.ServeHTTP))
	return h
}

// ServerInfo is what GET /v1/server says of the server: the node it runs
// as, the deadline of its transient phases (serve --deadline) and the view
// its reads come from ("kv" or "sql"). Clients read the deadline from it,
// as torpor top does to judge the age of a transient sandbox.
type ServerInfo struct {
	Node            string  `json:"node"`
	DeadlineSeconds float64 `json:"deadline_seconds"`
	ReadFrom        string  `json:"read_from"`
}

// WithServerInfo serves info on GET /v1/server.
func (h *HTTP) WithServerInfo(info ServerInfo) *HTTP {
	h.handle("GET /v1/server", events.ScopeRead, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, info)
	})
	return h
}

// NewHTTP returns the handler. ready reports whether the service may take
// traffic (for /readyz).
func NewHTTP(svc *Service, views Views, ready func(context.Context) error, log zerolog.Logger) *HTTP {
	h := &HTTP{svc: svc, views: views, ready: ready, log: log, mux: http.NewServeMux()}
	read, write := events.ScopeRead, events.ScopeWrite
	h.handle("POST /v1/sandboxes", write, h.create)
	h.handle("GET /v1/sandboxes", read, h.withHead(h.list))
	h.handle("GET /v1/sandboxes/{ref}", read, h.get)
	h.handle("DELETE /v1/sandboxes/{id}", write, h.lifecycle(VerbDelete))
	for _, verb := range []string{VerbStart, VerbStop, VerbSuspend, VerbResume} {
		h.handle("POST /v1/sandboxes/{id}/"+verb, write, h.lifecycle(verb))
	}
	h.handle("GET /v1/sandboxes/{id}/events", read, h.history)
	h.handle("GET /v1/sandboxes/{id}/logs", read, h.logs)
	h.handle("GET /v1/drivers", read, h.drivers)
	h.handle("POST /v1/sandboxes/{id}/forwards", write, h.forward)
	h.handle("DELETE /v1/sandboxes/{id}/forwards/{fid}", write, h.unforward)
	h.handle("POST /v1/sandboxes/{id}/touch", write, h.lifecycle(VerbTouch))
	h.handle("GET /v1/sandboxes/{id}/wait", read, h.limited(streamWait, h.wait))
	h.handle("GET /v1/watch", read, h.limited(streamWatch, h.watch))
	h.handle("GET /v1/phases", read, h.withHead(h.phases))
	h.handle("GET /v1/whoami", read, h.whoami)
	h.handle("GET /healthz", scopeOpen, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	h.handle("GET /readyz", scopeOpen, h.readyz)
	// A route the API lacks is NOT_FOUND to a caller with a token, and
	// UNAUTHENTICATED to one without: an outsider learns no routes.
	h.handle("/", read, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, events.Errorf(events.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
	})
	return h
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes the contract error body with the code's status.
func writeError(w http.ResponseWriter, err error) {
	e := events.AsError(natserr.Classify(err))
	writeJSON(w, e.Code.HTTPStatus(), events.ErrorBody{Error: e})
}

// decode decodes r's body into v, at most the configured MaxBody of it.
func (h *HTTP) decode(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeBody(http.MaxBytesReader(w, r.Body, h.svc.cfg.MaxBody), h.svc.cfg.MaxBody, v)
}

// decodeBody reads a JSON body of at most max bytes into v, refusing unknown
// fields and trailing data. An empty body leaves v as it is.
func decodeBody(r io.Reader, max int64, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return events.Errorf(events.CodeInvalidArgument, "body exceeds %d bytes", max)
		}
		return events.Errorf(events.CodeInvalidArgument, "read body: %v", err)
	}
	if int64(len(data)) > max {
		return events.Errorf(events.CodeInvalidArgument, "body exceeds %d bytes", max)
	}
	return decodeJSON(data, v)
}

func decodeJSON(data []byte, v any) error {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return events.Errorf(events.CodeInvalidArgument, "malformed JSON body: %v", err)
	}
	if dec.More() {
		return events.Errorf(events.CodeInvalidArgument, "malformed JSON body: data after the object")
	}
	return nil
}

// actor is who sent r, for the log: the name of its token (token:<name>),
// or, when the server authenticates nothing, its remote address. Nothing the
// client sets (no header) can change it.
func actor(r *http.Request) string {
	if tok, ok := principal(r.Context()); ok {
		return "token:" + tok.Name
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "http:" + host
}

func (h *HTTP) create(w http.ResponseWriter, r *http.Request) {
	var req events.CreateRequest
	if err := h.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	ow, err := h.outcomeWait(r)
	if err != nil {
		writeError(w, err)
		return
	}
	defer ow.release()
	if err := h.checkQuota(r); err != nil {
		writeError(w, err)
		return
	}
	v, err := h.svc.Handle(r.Context(), Command{Verb: VerbCreate, Actor: actor(r), IdempotencyKey: r.Header.Get("Idempotency-Key"), Create: req})
	if err != nil {
		writeError(w, err)
		return
	}
	h.holdQuota(r, v.ID)
	if ow.on {
		h.settle(w, r, ow, v, http.StatusCreated)
		return
	}
	writeJSON(w, http.StatusCreated, v)
}

// outcome is a command's wait for its outcome (?wait=true[&timeout=D]):
// on says whether it was asked for, deadline is when it gives up, release
// gives back the place it holds among the server's and the token's waits.
type outcome struct {
	on       bool
	deadline time.Time
	timeout  time.Duration
	release  func()
}

// outcomeWait reads a command's ?wait= and ?timeout= (default 30s, at most
// 10m, as GET …/wait takes it; timeout only with wait=true) and, when it
// waits, takes its place among the waits (Limits.Waits, the token's
// TokenLimits.Waits) before the command runs: a wait refused
// RESOURCE_EXHAUSTED leaves the command undone. The timeout counts from
// here, the command's time included.
func (h *HTTP) outcomeWait(r *http.Request) (outcome, error) {
	ow := outcome{release: func() {}}
	q := r.URL.Query()
	if wv := q.Get("wait"); wv != "" {
		on, err := strconv.ParseBool(wv)
		if err != nil {
			return ow, events.Errorf(events.CodeInvalidArgument, "wait=%q: want true or false", wv)
		}
		ow.on = on
	}
	ow.timeout = 30 * time.Second
	if t := q.Get("timeout"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 || d > 10*time.Minute {
			return ow, events.Errorf(events.CodeInvalidArgument, "timeout=%q: want a duration up to 10m", t)
		}
		if !ow.on {
			return ow, events.Errorf(events.CodeInvalidArgument, "timeout=%q: a command takes a timeout with wait=true only", t)
		}
		ow.timeout = d
	}
	if !ow.on {
		return ow, nil
	}
	ow.deadline = time.Now().Add(ow.timeout)
	release, err := admit(&h.waits, h.svc.cfg.Limits.Waits, "waits")
	if err != nil {
		return ow, err
	}
	done, err := h.quotas.open(who(r), streamWait, h.guard.Limits)
	if err != nil {
		release()
		return ow, err
	}
	ow.release = func() { done(); release() }
	return ow, nil
}

// TimedOutBody is the body of a command with ?wait=true whose outcome was
// not in the view by its timeout: DEADLINE_EXCEEDED (504), and the view as
// it was then (the command was accepted and goes on).
type TimedOutBody struct {
	Error *events.Error `json:"error"`
	View  events.View   `json:"view"`
}

// settle answers, with status, the outcome of the command answered with v:
// v itself when its phase is not transient (a command that had nothing to
// do, or was refused nothing and done at once), else the first view above
// the one before v whose phase is not transient (Views.Settle), from the
// view the reads come from. At the deadline it answers TimedOutBody with
// the newer of the last view seen and v.
func (h *HTTP) settle(w http.ResponseWriter, r *http.Request, ow outcome, v events.View, status int) {
	if !v.Phase.Transient() {
		writeJSON(w, status, v)
		return
	}
	LongLived(w) // up to 10m, its own timeout
	ctx, cancel := context.WithDeadline(r.Context(), ow.deadline)
	defer cancel()
	got, err := h.views.Settle(ctx, v.ID, v.Seq-1)
	if err == nil {
		writeJSON(w, status, got)
		return
	}
	if r.Context().Err() != nil {
		return // the client left
	}
	if ctx.Err() == nil {
		writeError(w, err)
		return
	}
	if got.Seq < v.Seq {
		got = v
	}
	e := events.Errorf(events.CodeDeadlineExceeded, "sandbox %s: no outcome in %s (it is %s); the command was accepted and goes on", v.ID, ow.timeout, got.Phase)
	writeJSON(w, e.Code.HTTPStatus(), TimedOutBody{Error: e, View: got})
}

func (h *HTTP) lifecycle(verb string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body BusRequest
		if err := h.decode(w, r, &body); err != nil {
			writeError(w, err)
			return
		}
		ow, err := h.outcomeWait(r)
		if err != nil {
			writeError(w, err)
			return
		}
		defer ow.release()
		id := r.PathValue("id")
		if body.ID != "" && body.ID != id {
			writeError(w, events.Errorf(events.CodeInvalidArgument, "body id %q differs from path id %q", body.ID, id))
			return
		}
		c := Command{Verb: verb, ID: id, Actor: actor(r), IdempotencyKey: r.Header.Get("Idempotency-Key")}
		if err := body.options(verb, &c); err != nil {
			writeError(w, err)
			return
		}
		v, err := h.svc.Handle(r.Context(), c)
		if err != nil {
			writeError(w, err)
			return
		}
		if verb == VerbDelete {
			h.releaseQuota(r, v.ID)
		}
		if ow.on {
			h.settle(w, r, ow, v, http.StatusOK)
			return
		}
		writeJSON(w, http.StatusAccepted, v)
	}
}

func (h *HTTP) get(w http.ResponseWriter, r *http.Request) {
	id, err := h.svc.Resolve(r.Context(), r.PathValue("ref"))
	if err != nil {
		writeError(w, err)
		return
	}
	if at := r.URL.Query().Get("at"); at != "" {
		var (
			seq uint64
			t   time.Time
		)
		if seq, err = strconv.ParseUint(at, 10, 64); err != nil {
			if t, err = time.Parse(time.RFC3339Nano, at); err != nil {
				writeError(w, events.Errorf(events.CodeInvalidArgument, "at=%q: want a sequence number or an RFC 3339 time", at))
				return
			}
		}
		v, err := h.svc.ViewAt(r.Context(), id, seq, t)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
		return
	}
	v, err := h.views.Get(r.Context(), id)
	if errors.Is(err, events.ErrNotFound) || events.CodeOf(err) == events.CodeNotFound {
		// Not projected yet: answer from the log, so a create is readable at once.
		var sb *Sandbox
		if sb, err = h.svc.Sandbox(r.Context(), id); err == nil {
			v = sb.View
		}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// listSorts are the orders of a list (CONTRACT §5), as the views take them.
var listSorts = []string{"created", "name", "-name", "age", "-age"}

// list answers a page of sandboxes: filters phase, label (k=v), name (a
// substring, in any case), driver and node; sort; limit; cursor (the next
// of the page before, of the same sort). The body holds the total of
// matches over all pages.
func (h *HTTP) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	lq := ListQuery{Phase: events.Phase(q.Get("phase")), Label: q.Get("label"), Cursor: q.Get("cursor"),
		Name: q.Get("name"), Driver: q.Get("driver"), Node: q.Get("node"), Sort: q.Get("sort")}
	if lq.Phase != "" && !lq.Phase.Known() {
		writeError(w, events.Errorf(events.CodeInvalidArgument, "unknown phase %q", lq.Phase))
		return
	}
	if lq.Sort != "" && !slices.Contains(listSorts, lq.Sort) {
		writeError(w, events.Errorf(events.CodeInvalidArgument, "unknown sort %q: want one of %s", lq.Sort, strings.Join(listSorts, ", ")))
		return
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, events.Errorf(events.CodeInvalidArgument, "limit=%q: want 1 to 1000", l))
			return
		}
		lq.Limit = n
	}
	page, err := h.views.List(r.Context(), lq)
	if err != nil {
		writeError(w, err)
		return
	}
	if page.Items == nil {
		page.Items = []events.View{}
	}
	writeJSON(w, http.StatusOK, page)
}

func (h *HTTP) history(w http.ResponseWriter, r *http.Request) {
	var after uint64
	if a := r.URL.Query().Get("after"); a != "" {
		var err error
		if after, err = strconv.ParseUint(a, 10, 64); err != nil {
			writeError(w, events.Errorf(events.CodeInvalidArgument, "after=%q: want a sequence number", a))
			return
		}
	}
	var envs []events.Envelope
	var err error
	if hv, ok := h.views.(Histories); ok {
		envs, err = h.svc.HistoryFrom(r.Context(), r.PathValue("id"), after, hv)
	} else {
		envs, err = h.svc.History(r.Context(), r.PathValue("id"), after)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	items := make([]events.HistoryEntry, len(envs))
	for i, e := range envs {
		items[i] = e.HistoryEntry()
	}
	writeJSON(w, http.StatusOK, events.History{Items: items})
}

// logs answers the last ?tail= lines (default 100, at most 10000) of the
// workload's output, as text.
func (h *HTTP) logs(w http.ResponseWriter, r *http.Request) {
	tail := 100
	if t := r.URL.Query().Get("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, events.Errorf(events.CodeInvalidArgument, "tail=%q: want 1 to 10000 lines", t))
			return
		}
		tail = n
	}
	id, err := h.svc.Resolve(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	out, err := h.svc.Logs(r.Context(), id, tail)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// forwardBody is the body of POST /v1/sandboxes/{id}/forwards.
type forwardBody struct {
	Listen string `json:"listen"`
	Port   int    `json:"port"`
}

// forward opens a TCP forward from a local address to a port of the
// sandbox: 201 and the forward with its bound address. Something must
// listen on the port in the sandbox.
func (h *HTTP) forward(w http.ResponseWriter, r *http.Request) {
	if h.forwards == nil {
		writeError(w, events.Errorf(events.CodeUnimplemented, "this server serves no forwards"))
		return
	}
	var body forwardBody
	if err := h.decode(w, r, &body); err != nil {
		writeError(w, err)
		return
	}
	if body.Listen == "" {
		body.Listen = "127.0.0.1:0"
	}
	if _, port, err := net.SplitHostPort(body.Listen); err != nil || port == "" {
		writeError(w, events.Errorf(events.CodeInvalidArgument, "listen %q: want host:port (127.0.0.1:0 picks a port)", body.Listen))
		return
	}
	if tok, _ := principal(r.Context()); !Loopback(body.Listen) && !events.Allows(tok.Scopes, events.ScopeAdmin) {
		writeError(w, events.Errorf(events.CodePermissionDenied, "listen %q: a forward off loopback wants a token with admin", body.Listen))
		return
	}
	if body.Port < 1 || body.Port > 65535 {
		writeError(w, events.Errorf(events.CodeInvalidArgument, "port %d: want 1 to 65535", body.Port))
		return
	}
	id, err := h.svc.Resolve(r.Context(), r.PathValue("id"))
	if err == nil {
		_, err = h.svc.Sandbox(r.Context(), id)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	fid := CommandID(VerbForward, id, key) // a retry with the key finds its forward
	addr, err := h.forwards.Bind(r.Context(), id, fid, body.Listen, body.Port, true)
	if err != nil {
		code := events.CodeOf(err)
		if code == events.CodeInternal {
			code = events.CodeFailedPrecondition
		}
		writeError(w, events.Errorf(code, "%v", err))
		return
	}
	f := events.Forward{ID: fid, Listen: body.Listen, Address: addr, Port: body.Port}
	v, err := h.svc.Handle(r.Context(), Command{Verb: VerbForward, ID: id, Actor: actor(r), IdempotencyKey: key, Forward: f})
	if err != nil {
		h.forwards.Close(fid)
		writeError(w, err)
		return
	}
	if got, ok := v.Forward(fid); ok {
		// A retry with the key answers the first answer (KeyTTL), which
		// names the forward even if it was closed since: the listener
		// the retry bound serves only a forward the sandbox has now.
		if cur, err := h.svc.Sandbox(r.Context(), id); err == nil {
			if _, open := cur.View.Forward(fid); open {
				h.forwards.Serve(fid)
				writeJSON(w, http.StatusCreated, got)
				return
			}
		}
		h.forwards.Close(fid)
		writeJSON(w, http.StatusCreated, got)
		return
	}
	h.forwards.Close(fid)
	writeError(w, events.Errorf(events.CodeAborted, "forward %s of %s: not in the sandbox's view; retry", fid, id))
}

// unforward closes a forward: 202 and the view.
func (h *HTTP) unforward(w http.ResponseWriter, r *http.Request) {
	id, err := h.svc.Resolve(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	fid := r.PathValue("fid")
	v, err := h.svc.Handle(r.Context(), Command{Verb: VerbUnforward, ID: id, Actor: actor(r), IdempotencyKey: r.Header.Get("Idempotency-Key"), Forward: events.Forward{ID: fid}})
	if err != nil {
		writeError(w, err)
		return
	}
	if h.forwards != nil {
		h.forwards.Close(fid)
	}
	writeJSON(w, http.StatusAccepted, v)
}

// drivers lists each driver with its capabilities.
func (h *HTTP) drivers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string][]DriverInfo{"items": h.svc.DriverList()})
}

func (h *HTTP) wait(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	q := r.URL.Query()
	phase := events.Phase(q.Get("phase"))
	if !phase.Known() {
		writeError(w, events.Errorf(events.CodeInvalidArgument, "phase=%q: want one of %v", phase, events.Phases))
		return
	}
	timeout := 30 * time.Second
	if t := q.Get("timeout"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 || d > 10*time.Minute {
			writeError(w, events.Errorf(events.CodeInvalidArgument, "timeout=%q: want a duration up to 10m", t))
			return
		}
		timeout = d
	}
	var after uint64
	if a := q.Get("after"); a != "" {
		var err error
		if after, err = strconv.ParseUint(a, 10, 64); err != nil {
			writeError(w, events.Errorf(events.CodeInvalidArgument, "after=%q: want a sequence number", a))
			return
		}
	}
	release, err := admit(&h.waits, h.svc.cfg.Limits.Waits, "waits")
	if err != nil {
		writeError(w, err)
		return
	}
	defer release()
	LongLived(w) // up to 10m, its own timeout
	// An unknown sandbox is NOT_FOUND at once (the view would wait for
	// it); one in the service's cache is known without its lock, which a
	// command on it may hold across its append.
	if !h.svc.Known(id) {
		if _, err := h.svc.Sandbox(r.Context(), id); err != nil {
			writeError(w, err)
			return
		}
	}
	// The timeout counts from here, as the client's does: a client that
	// gives up at its end finds the place the wait held free again.
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	// The view it answers is at least as new as the log when asked: a
	// view read from a replica that lags (a NATS server that just came
	// back) must not pass an older phase off as the one waited for.
	head, err := h.svc.Head(ctx, id)
	if err != nil {
		if ctx.Err() != nil {
			err = events.Errorf(events.CodeDeadlineExceeded, "sandbox %s: the log's head not read in %s", id, timeout)
		}
		writeError(w, err)
		return
	}
	if head > 0 {
		after = max(after, head-1)
	}
	v, err := h.views.Wait(ctx, id, phase, after)
	if err != nil {
		if ctx.Err() != nil {
			err = events.Errorf(events.CodeDeadlineExceeded, "sandbox %s did not reach %s in %s (it is %s)", id, phase, timeout, v.Phase)
		}
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (h *HTTP) watch(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, events.Errorf(events.CodeInternal, "streaming unsupported"))
		return
	}
	var after uint64
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		var err error
		if after, err = strconv.ParseUint(last, 10, 64); err != nil {
			writeError(w, events.Errorf(events.CodeInvalidArgument, "Last-Event-ID %q: want a sequence number", last))
			return
		}
	}
	release, err := admit(&h.watches, h.svc.cfg.Limits.Watches, "watches")
	if err != nil {
		writeError(w, err)
		return
	}
	defer release()
	LongLived(w) // until the client leaves
	ch, err := h.views.Watch(r.Context(), after)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	rc := http.NewResponseController(w)
	for v := range ch {
		data, _ := json.Marshal(v)
		// A client that takes no view for a write timeout is cut off:
		// a watch that never reads would hold its place for ever.
		_ = rc.SetWriteDeadline(time.Now().Add(DefaultWriteTimeout))
		if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", v.Seq, data); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}

func (h *HTTP) phases(w http.ResponseWriter, r *http.Request) {
	counts, err := h.views.Counts(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, counts)
}

func (h *HTTP) readyz(w http.ResponseWriter, r *http.Request) {
	if h.ready != nil {
		if err := h.ready(r.Context()); err != nil {
			writeError(w, events.Errorf(events.CodeUnavailable, "not ready: %v", err))
			return
		}
	}
	body := map[string]any{"status": "ready"}
	if h.lags != nil {
		body["lag"] = h.lags(r.Context())
	}
	writeJSON(w, http.StatusOK, body)
}
