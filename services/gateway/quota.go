package gateway

import (
	"context"
	"net/http"
	"sync"

	"golang.org/x/time/rate"

	"github.com/torpor/torpor/events"
)

// TokenLimits bound what one token may ask of one server (an instance: two
// instances each allow it as much again). Zero fields do not limit.
type TokenLimits struct {
	// Rate is the requests a second a token may send, on average; Burst
	// how many at once above it. Past it: RESOURCE_EXHAUSTED at once.
	Rate  float64
	Burst int
	// Watches and Waits are how many watches (GET /v1/watch) and waits
	// (GET …/wait) a token may hold open at once. Past them:
	// RESOURCE_EXHAUSTED at once, never a queue.
	Watches int
	Waits   int
	// Sandboxes is how many sandboxes a token may have made and not
	// deleted (on every server together: the count is kept on the bus).
	// Past it a create is RESOURCE_EXHAUSTED.
	Sandboxes int
}

// DefaultTokenLimits are serve's defaults (the README's Limits table).
var DefaultTokenLimits = TokenLimits{Rate: 1000, Burst: 2000, Watches: 32, Waits: 1024, Sandboxes: 10000}

// quotas keeps, per token (or, without authentication, per remote
// address), its rate limiter and its open watches and waits.
type quotas struct {
	mu  sync.Mutex
	per map[string]*quota
}

type quota struct {
	limiter        *rate.Limiter
	watches, waits int
}

// who is the key a request's quotas are kept under: its actor, the token's
// name, or its remote address when the server authenticates nothing.
func who(r *http.Request) string { return actor(r) }

func (q *quotas) get(key string, l TokenLimits) *quota {
	if q.per == nil {
		q.per = map[string]*quota{}
	}
	e := q.per[key]
	if e == nil {
		e = &quota{}
		if l.Rate > 0 {
			e.limiter = rate.NewLimiter(rate.Limit(l.Rate), max(l.Burst, 1))
		}
		q.per[key] = e
	}
	return e
}

// allow takes one request of key's rate.
func (q *quotas) allow(key string, l TokenLimits) error {
	if l.Rate <= 0 {
		return nil
	}
	q.mu.Lock()
	e := q.get(key, l)
	q.mu.Unlock()
	if !e.limiter.Allow() {
		return events.Errorf(events.CodeResourceExhausted, "%s sends more than %g requests a second (burst %d); slow down", key, l.Rate, l.Burst)
	}
	return nil
}

// stream kinds: what a token holds open.
const (
	streamWatch = "watches"
	streamWait  = "waits"
)

// open takes one stream of kind for key, refusing past the limit; done
// gives it back.
func (q *quotas) open(key, kind string, l TokenLimits) (done func(), err error) {
	limit := l.Watches
	if kind == streamWait {
		limit = l.Waits
	}
	if limit <= 0 {
		return func() {}, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.get(key, l)
	n := &e.watches
	if kind == streamWait {
		n = &e.waits
	}
	if *n >= limit {
		return nil, events.Errorf(events.CodeResourceExhausted, "%s holds %d %s open, the most a token may on this server; close one first", key, *n, kind)
	}
	*n++
	return func() {
		q.mu.Lock()
		*n--
		q.mu.Unlock()
	}, nil
}

// limited wraps f, a route that holds its answer open (a watch, a wait),
// in the token's count of kind.
func (h *HTTP) limited(kind string, f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		done, err := h.quotas.open(who(r), kind, h.guard.Limits)
		if err != nil {
			writeError(w, err)
			return
		}
		defer done()
		f(w, r)
	}
}

// SandboxQuota counts the sandboxes each token made and has not deleted
// (access.Quota does, on the bus).
type SandboxQuota interface {
	Held(ctx context.Context, token string) ([]string, error)
	Hold(ctx context.Context, token, id string) error
	Release(ctx context.Context, id string) error
}

// WithQuota counts each token's sandboxes in q, for TokenLimits.Sandboxes.
func (h *HTTP) WithQuota(q SandboxQuota) *HTTP {
	h.quota = q
	return h
}

// checkQuota refuses a create by a token that holds its most sandboxes. At
// the limit, it first lets go of those deleted (or never made) since they
// were counted: a delete over the bus, or one whose release failed, frees
// its place here.
func (h *HTTP) checkQuota(r *http.Request) error {
	tok, ok := principal(r.Context())
	limit := h.guard.Limits.Sandboxes
	if !ok || limit <= 0 || h.quota == nil {
		return nil
	}
	ctx := r.Context()
	ids, err := h.quota.Held(ctx, tok.Name)
	if err != nil || len(ids) < limit {
		return err
	}
	held := 0
	for _, id := range ids {
		v, err := h.views.Get(ctx, id)
		if events.CodeOf(err) == events.CodeNotFound {
			var sb *Sandbox
			if sb, err = h.svc.Sandbox(ctx, id); err == nil {
				v = sb.View
			}
		}
		switch {
		case events.CodeOf(err) == events.CodeNotFound || (err == nil && v.Phase == events.PhaseDeleted):
			if err := h.quota.Release(ctx, id); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			held++
		}
	}
	if held >= limit {
		return events.Errorf(events.CodeResourceExhausted, "token %s holds %d sandboxes, its quota; delete one first", tok.Name, held)
	}
	return nil
}

// holdQuota counts sandbox id, just made, against the request's token.
func (h *HTTP) holdQuota(r *http.Request, id string) {
	tok, ok := principal(r.Context())
	if !ok || h.guard.Limits.Sandboxes <= 0 || h.quota == nil {
		return
	}
	if err := h.quota.Hold(r.Context(), tok.Name, id); err != nil {
		// The sandbox is made; not counting it favours the token, and
		// the next count at the limit finds the truth in the views.
		h.log.Warn().Err(err).Str("sandbox_id", id).Str("token", tok.Name).Msg("sandbox not counted against its token's quota")
	}
}

// releaseQuota counts sandbox id, being deleted, against nobody.
func (h *HTTP) releaseQuota(r *http.Request, id string) {
	if h.quota == nil {
		return
	}
	if err := h.quota.Release(r.Context(), id); err != nil {
		h.log.Warn().Err(err).Str("sandbox_id", id).Msg("deleted sandbox still counted against its token's quota until the next count at the limit")
	}
}
