// Package web is the ops dashboard: plain HTML, CSS and JavaScript modules
// under ui/, embedded in the binary, with no build step. The gateway serves
// it at GET / and GET /ui/... without a token: the files hold no data, and
// every API call the page makes carries the token its user signed in with
// (kept in the browser's session storage, never in a URL or a cookie).
package web

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strings"

	"github.com/torpor/torpor/events"
)

//go:embed ui
var files embed.FS

// UI is the dashboard's files: index.html and its assets.
func UI() fs.FS {
	sub, err := fs.Sub(files, "ui")
	if err != nil {
		panic(err) // the directory is embedded above
	}
	return sub
}

// CSP is the dashboard's Content-Security-Policy: its own scripts, styles
// and API only; no inline script or style, no frames, no other origin.
const CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves GET / (index.html) and GET /ui/<file> (its assets), with
// the security headers on every answer, a missing file included.
func Handler() http.Handler {
	ui := UI()
	assets := http.StripPrefix("/ui/", http.FileServerFS(ui))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == "/" {
			http.ServeFileFS(w, r, ui, "index.html")
			return
		}
		if r.URL.Path == "/ui/" || r.URL.Path == "/ui/index.html" {
			// The page lives at /, once.
			http.Redirect(w, r, "/", http.StatusMovedPermanently)
			return
		}
		if _, err := fs.Stat(ui, strings.TrimPrefix(r.URL.Path, "/ui/")); err != nil {
			// The contract's error body, as for any route the API lacks.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(events.ErrorBody{Error: events.AsError(events.Errorf(events.CodeNotFound, "no file %s", r.URL.Path))})
			return
		}
		assets.ServeHTTP(w, r)
	})
}
