package gateway

import (
	"net/http"
	"time"
)

// Timeouts bound how long a client may take over a request, so that slow
// or idle connections cannot pile up: the header, the whole request with
// its body, the answer, and the wait for the next request on a kept-alive
// connection. Long-lived answers (watch, wait, a replay's progress) lift
// the read and write deadlines for themselves (LongLived). Zero fields are
// the defaults below (the README's "Limits" table).
type Timeouts struct {
	ReadHeader, Read, Write, Idle time.Duration
	// MaxHeaderBytes bounds a request's header.
	MaxHeaderBytes int
}

// Defaults of Timeouts.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
)

// Server is an http.Server serving h with the timeouts t (zero fields:
// the defaults).
func (t Timeouts) Server(h http.Handler) *http.Server {
	or := func(d, def time.Duration) time.Duration {
		if d == 0 {
			return def
		}
		return d
	}
	mh := t.MaxHeaderBytes
	if mh == 0 {
		mh = DefaultMaxHeaderBytes
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: or(t.ReadHeader, DefaultReadHeaderTimeout),
		ReadTimeout:       or(t.Read, DefaultReadTimeout),
		WriteTimeout:      or(t.Write, DefaultWriteTimeout),
		IdleTimeout:       or(t.Idle, DefaultIdleTimeout),
		MaxHeaderBytes:    mh,
	}
}

// LongLived lifts the server's read and write deadlines from a request
// whose answer may outlast them (a watch, a wait, a replay streaming its
// progress): it ends with its client or its own timeout. Its body, if any,
// must be read before. Without it the read deadline would cancel the
// request's context mid-answer and the write deadline cut the stream.
func LongLived(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
}
