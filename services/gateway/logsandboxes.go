package gateway

import (
	"context"
	"net/http"

	"github.com/torpor/torpor/events"
)

// LogSandboxes is the answer of GET /v1/log/sandboxes.
type LogSandboxes struct {
	Items []string `json:"items"`
}

// WithLogSandboxes serves GET /v1/log/sandboxes: the id of every sandbox
// the log holds a subject for, from list (jsstore's Sandboxes: the
// stream's own subject list), deleted ones too. torpor check enumerates
// the sandboxes it judges so, from the log and not from a view.
func (h *HTTP) WithLogSandboxes(list func(context.Context) ([]string, error)) *HTTP {
	h.handle("GET /v1/log/sandboxes", events.ScopeRead, func(w http.ResponseWriter, r *http.Request) {
		ids, err := list(r.Context())
		if err != nil {
			writeError(w, err)
			return
		}
		if ids == nil {
			ids = []string{}
		}
		writeJSON(w, http.StatusOK, LogSandboxes{Items: ids})
	})
	return h
}
