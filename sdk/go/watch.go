package torpor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/torpor/torpor/events"
)

// Watch streams view changes from GET /v1/watch (server-sent events: id the
// view's seq, data the view), those with a seq above after (0: from what the
// server holds now on), and calls fn with each in the order they arrive.
//
// When the stream breaks (a dropped connection, a restarted server), Watch
// reconnects after a short backoff with Last-Event-ID set to the seq of the
// last event it received, so that nothing is skipped; a view whose seq is at
// or below one already delivered for the same sandbox is dropped, so that
// nothing is delivered twice. It returns ctx.Err() once ctx ends, fn's error
// as soon as fn returns one, and an answer of the server that retrying cannot
// change (INVALID_ARGUMENT, say) as a contract error.
//
// The stream stays open as long as ctx does: the http.Client given to New
// must have no Timeout for a long watch (use ctx to bound it).
func (c *Client) Watch(ctx context.Context, after uint64, fn func(events.View) error) error {
	w := &watcher{after: after, last: after, seen: map[string]uint64{}, fn: fn}
	backoff := minBackoff
	for {
		delivered := w.delivered
		err := c.watchOnce(ctx, w)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, errFn):
			return w.fnErr
		case err != nil && !retryable(err):
			return err
		}
		if w.delivered > delivered {
			backoff = minBackoff // it was up: reconnect soon
		}
		if err := sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// Backoff bounds of the reconnects and retries.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// watcher is the state of one Watch across its connections.
type watcher struct {
	after     uint64            // what the caller saw already
	last      uint64            // the seq of the last event received: Last-Event-ID
	seen      map[string]uint64 // the seq of the last view delivered, by sandbox
	fn        func(events.View) error
	fnErr     error
	delivered int
}

// errFn marks the end of a stream because fn returned an error.
var errFn = errors.New("watch: fn returned an error")

// deliver passes v to fn unless it is no newer than what was delivered of
// its sandbox.
func (w *watcher) deliver(v events.View) error {
	if v.Seq <= w.after || v.Seq <= w.seen[v.ID] {
		return nil
	}
	if err := w.fn(v); err != nil {
		w.fnErr = err
		return errFn
	}
	w.seen[v.ID] = v.Seq
	w.delivered++
	return nil
}

// watchOnce reads one connection's stream until it ends.
func (c *Client) watchOnce(ctx context.Context, w *watcher) error {
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/watch", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if w.last > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatUint(w.last, 10))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return transportError(ctx, "GET /v1/watch", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return answerError(http.MethodGet, "/v1/watch", resp, data)
	}
	return readEvents(resp.Body, func(id, data string) error {
		var v events.View
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return events.Errorf(events.CodeInternal, "GET /v1/watch: decode view: %v", err)
		}
		if err := w.deliver(v); err != nil {
			return err
		}
		if n, err := strconv.ParseUint(id, 10, 64); err == nil {
			w.last = n
		} else if v.Seq > 0 {
			w.last = v.Seq
		}
		return nil
	})
}

// readEvents parses a server-sent event stream (the subset torpor sends: id,
// data, comments) and calls each for every event, until the stream ends (an
// UNAVAILABLE error: it broke) or each returns an error.
func readEvents(r io.Reader, each func(id, data string) error) error {
	br := bufio.NewReader(r)
	var (
		id   string
		data strings.Builder
		has  bool
	)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return events.Errorf(events.CodeUnavailable, "GET /v1/watch: stream ended: %v", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if has {
				if err := each(id, data.String()); err != nil {
					return err
				}
			}
			id, has = "", false
			data.Reset()
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			id = value
		case "data":
			if has {
				data.WriteByte('\n')
			}
			data.WriteString(value)
			has = true
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
