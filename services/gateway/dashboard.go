package gateway

import (
	"net/http"
	"strconv"

	"github.com/torpor/torpor/events"
)

// HeaderLogHead is the response header of GET /v1/sandboxes and GET
// /v1/phases that names a sequence of the log every event up to which was
// in the views the answer was read from: the log's last sequence, read
// before the views, less the lag of the view furthest behind then. A
// client that starts GET /v1/watch with Last-Event-ID set to it misses no
// change after what it was shown (it may be sent a view it was shown), and
// is not sent the current view of every sandbox first (the dashboard does
// so).
const HeaderLogHead = "Torpor-Log-Head"

// WithDashboard serves ui, the ops dashboard's static files (package web),
// at GET / and GET /ui/..., to anyone: they hold no data, and every API
// call the page makes carries its token. Every other route the API lacks
// stays NOT_FOUND to a caller with a token and UNAUTHENTICATED to one
// without.
func (h *HTTP) WithDashboard(ui http.Handler) *HTTP {
	h.mux.Handle("GET /{$}", ui)
	h.mux.Handle("GET /ui/", ui)
	return h
}

// Whoami is the answer of GET /v1/whoami: the name and scopes of the token
// the request came with. A server without authentication (serve --no-auth)
// answers every scope and no name.
type Whoami struct {
	Name   string         `json:"name"`
	Scopes []events.Scope `json:"scopes"`
}

// whoami tells a client what its token may do: the dashboard shows action
// buttons to a token with write only.
func (h *HTTP) whoami(w http.ResponseWriter, r *http.Request) {
	tok, ok := principal(r.Context())
	if !ok {
		writeJSON(w, http.StatusOK, Whoami{Scopes: []events.Scope{events.ScopeRead, events.ScopeWrite, events.ScopeAdmin}})
		return
	}
	scopes := tok.Scopes
	if scopes == nil {
		scopes = []events.Scope{}
	}
	writeJSON(w, http.StatusOK, Whoami{Name: tok.Name, Scopes: scopes})
}

// withHead sets HeaderLogHead on f's answer: the log's last sequence
// before f reads its views, less the largest lag of a view (WithLags) then;
// a log that cannot tell, or an HTTP API over views alone (no Service),
// leaves it out.
func (h *HTTP) withHead(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.svc == nil {
			f(w, r)
			return
		}
		if seq, err := h.svc.store.LastSeq(r.Context()); err == nil {
			if h.lags != nil {
				var behind uint64
				for _, lag := range h.lags(r.Context()) {
					behind = max(behind, lag)
				}
				seq -= min(behind, seq)
			}
			w.Header().Set(HeaderLogHead, strconv.FormatUint(seq, 10))
		}
		f(w, r)
	}
}
