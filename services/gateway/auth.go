package gateway

import (
	"context"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/torpor/torpor/events"
)

// Authenticator tells whose a bearer token is (access.Tokens does):
// UNAUTHENTICATED for one it does not know, or that was revoked or expired.
type Authenticator interface {
	Authenticate(ctx context.Context, secret string) (events.TokenInfo, error)
}

// HTTPGuard is what the HTTP API checks of every request before a handler runs
// (the README's Security section). Its zero value authenticates nothing:
// serve sets Auth unless --no-auth, which it allows on loopback only.
type HTTPGuard struct {
	// Auth authenticates bearer tokens; nil: every request is let in with
	// every scope (serve --no-auth).
	Auth Authenticator
	// Hosts are the names, besides IP literals and localhost, that a
	// request's Host may carry (serve --http-host). A name the server does
	// not answer for is refused: a page on another site whose name was
	// pointed at this address (DNS rebinding) cannot use it.
	Hosts []string
	// Origins are the browser origins ("https://ops.example.com") allowed
	// to call the API across origins (CORS); none by default.
	Origins []string
	// MetricsOpen serves GET /metrics to anyone; otherwise it wants read.
	MetricsOpen bool
	// Limits bound each token's requests, watches and waits.
	Limits TokenLimits
}

// scopeOpen is the scope of routes anyone may call (/healthz, /readyz);
// scopeMetrics that of /metrics, read unless HTTPGuard.MetricsOpen.
const (
	scopeOpen    events.Scope = ""
	scopeMetrics events.Scope = "metrics"
)

// WithGuard checks g on every request.
func (h *HTTP) WithGuard(g HTTPGuard) *HTTP {
	h.guard = g
	return h
}

// principalKey is the context key of the token a request came with.
type principalKey struct{}

// principal is the token the request was authenticated with; ok is false
// when the server authenticates nothing (--no-auth) or the route is open.
func principal(ctx context.Context) (events.TokenInfo, bool) {
	p, ok := ctx.Value(principalKey{}).(events.TokenInfo)
	return p, ok
}

// handle serves pattern with f for requests that hold scope need.
func (h *HTTP) handle(pattern string, need events.Scope, f http.HandlerFunc) {
	h.mux.Handle(pattern, h.authorize(need, f))
}

// Handle serves pattern with hd for requests that hold scope need (admin
// for anything that changes the service: serve adds POST /v1/replay so).
func (h *HTTP) Handle(pattern string, need events.Scope, hd http.Handler) {
	h.mux.Handle(pattern, h.authorize(need, hd.ServeHTTP))
}

// authorize wraps f: a request without a valid bearer token is
// UNAUTHENTICATED, one whose token lacks need PERMISSION_DENIED; the token
// goes into the request's context, for the actor of its commands.
func (h *HTTP) authorize(need events.Scope, f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if need == scopeOpen || (need == scopeMetrics && h.guard.MetricsOpen) {
			f(w, r)
			return
		}
		if h.guard.Auth == nil {
			if err := h.quotas.allow(who(r), h.guard.Limits); err != nil {
				writeError(w, err)
				return
			}
			f(w, r)
			return
		}
		if need == scopeMetrics {
			need = events.ScopeRead
		}
		scheme, secret, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="torpor"`)
			writeError(w, events.Errorf(events.CodeUnauthenticated, "no bearer token: send Authorization: Bearer <token> (serve writes one to <data>/admin.token; torpor token create makes more)"))
			return
		}
		tok, err := h.guard.Auth.Authenticate(r.Context(), strings.TrimSpace(secret))
		if err != nil {
			if events.CodeOf(err) == events.CodeUnauthenticated {
				w.Header().Set("WWW-Authenticate", `Bearer realm="torpor", error="invalid_token"`)
			}
			writeError(w, err)
			return
		}
		if !events.Allows(tok.Scopes, need) {
			writeError(w, events.Errorf(events.CodePermissionDenied, "token %s holds %v; %s %s wants %s", tok.Name, tok.Scopes, r.Method, r.URL.Path, need))
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), principalKey{}, tok))
		if err := h.quotas.allow(who(r), h.guard.Limits); err != nil {
			writeError(w, err)
			return
		}
		f(w, r)
	}
}

// ServeHTTP checks what every request must be before its route sees it:
// addressed to a host the server answers for, from no foreign browser
// origin, with a JSON body if any.
func (h *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.guard.hostAllowed(r.Host) {
		writeError(w, events.Errorf(events.CodePermissionDenied, "host %q: this server answers for IP addresses, localhost and --http-host names", r.Host))
		return
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		switch {
		case slices.Contains(h.guard.Origins, origin):
			hd := w.Header()
			hd.Set("Access-Control-Allow-Origin", origin)
			hd.Add("Vary", "Origin")
			hd.Set("Access-Control-Expose-Headers", HeaderLogHead)
			if r.Method == http.MethodOptions {
				hd.Set("Access-Control-Allow-Methods", "GET, POST, DELETE")
				hd.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, Idempotency-Key, Last-Event-ID")
				hd.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		case !sameOrigin(origin, r.Host):
			writeError(w, events.Errorf(events.CodePermissionDenied, "origin %q: not allowed (serve --cors-origin)", origin))
			return
		}
	}
	if r.ContentLength > 0 || len(r.TransferEncoding) > 0 {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			writeError(w, events.Errorf(events.CodeInvalidArgument, "Content-Type %q: a body must be application/json", r.Header.Get("Content-Type")))
			return
		}
	}
	h.mux.ServeHTTP(w, r)
}

// hostAllowed reports whether Host is one the server answers for: an IP
// literal, localhost, or one of g.Hosts; the port does not matter.
func (g HTTPGuard) hostAllowed(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.ToLower(strings.Trim(name, "[]")), ".")
	if name == "" {
		return false
	}
	if net.ParseIP(name) != nil || name == "localhost" {
		return true
	}
	for _, h := range g.Hosts {
		if strings.EqualFold(strings.TrimSuffix(h, "."), name) {
			return true
		}
	}
	return false
}

// sameOrigin reports whether a browser's Origin is the server's own (the
// dashboard served from it).
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, host)
}

// Loopback reports whether addr (host:port) is on the loopback interface
// only: a forward listening anywhere else needs admin, and serve --no-auth
// wants its --http there.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// TokenAdmin makes, lists and revokes bearer tokens (access.Tokens does).
type TokenAdmin interface {
	Create(ctx context.Context, req events.TokenRequest, by string) (events.NewToken, error)
	List(ctx context.Context) ([]events.TokenInfo, error)
	Revoke(ctx context.Context, name string) error
}

// WithTokens serves the token endpoints through t, to admin tokens only:
// POST /v1/tokens (201, the secret shown once), GET /v1/tokens, DELETE
// /v1/tokens/{name} (204).
func (h *HTTP) WithTokens(t TokenAdmin) *HTTP {
	admin := events.ScopeAdmin
	h.handle("POST /v1/tokens", admin, func(w http.ResponseWriter, r *http.Request) {
		var req events.TokenRequest
		if err := h.decode(w, r, &req); err != nil {
			writeError(w, err)
			return
		}
		tok, err := t.Create(r.Context(), req, actor(r))
		if err != nil {
			writeError(w, err)
			return
		}
		h.log.Info().Str("token", tok.Name).Str("actor", actor(r)).Msg("token created")
		writeJSON(w, http.StatusCreated, tok)
	})
	h.handle("GET /v1/tokens", admin, func(w http.ResponseWriter, r *http.Request) {
		items, err := t.List(r.Context())
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string][]events.TokenInfo{"items": items})
	})
	h.handle("DELETE /v1/tokens/{name}", admin, func(w http.ResponseWriter, r *http.Request) {
		if err := t.Revoke(r.Context(), r.PathValue("name")); err != nil {
			writeError(w, err)
			return
		}
		h.log.Info().Str("token", r.PathValue("name")).Str("actor", actor(r)).Msg("token revoked")
		w.WriteHeader(http.StatusNoContent)
	})
	return h
}
