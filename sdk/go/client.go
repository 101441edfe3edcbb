// Package torpor is the Go client of torpor's HTTP API (CONTRACT §5): typed
// calls for the lifecycle commands and the reads, with errors that carry the
// contract's codes. It shares only the wire types of package events.
package torpor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/torpor/torpor/events"
)

// Wire types shared with the server.
type (
	CreateRequest = events.CreateRequest
	Page          = events.Page
	Event         = events.HistoryEntry
)

// rawBody is an answer taken as it is (text), not decoded.
type rawBody []byte

// Client talks to one torpor server.
type Client struct {
	base string
	hc   *http.Client
}

// New returns a client of the server at base (e.g. "http://127.0.0.1:8080").
func New(base string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{}
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return &Client{base: strings.TrimRight(base, "/"), hc: hc}
}

// do sends a request and decodes a JSON answer into out; a contract error
// body comes back as *events.Error.
func (c *Client) do(ctx context.Context, method, path, key string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return events.Errorf(events.CodeUnavailable, "%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return events.Errorf(events.CodeUnavailable, "%s %s: %v", method, path, err)
	}
	if resp.StatusCode >= 300 {
		return answerError(method, path, resp, data)
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*rawBody); ok {
		*raw = data
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return events.Errorf(events.CodeInternal, "%s %s: decode answer: %v", method, path, err)
	}
	return nil
}

// Create creates a sandbox; key, if set, makes a retry safe.
func (c *Client) Create(ctx context.Context, r CreateRequest, key string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodPost, "/v1/sandboxes", key, r, &v)
}

// Get returns the view of a sandbox by id or name.
func (c *Client) Get(ctx context.Context, ref string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref), "", nil, &v)
}

// GetAt returns what the sandbox was at at (a sequence number or an RFC 3339 time).
func (c *Client) GetAt(ctx context.Context, ref, at string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(ref)+"?at="+url.QueryEscape(at), "", nil, &v)
}

// List lists sandboxes; phase and label ("k=v") filter when set.
func (c *Client) List(ctx context.Context, phase, label string, limit int, cursor string) (Page, error) {
	q := url.Values{}
	if phase != "" {
		q.Set("phase", phase)
	}
	if label != "" {
		q.Set("label", label)
	}
	if limit > 0 {
		q.Set("limit", fmt.Sprint(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var p Page
	return p, c.do(ctx, http.MethodGet, "/v1/sandboxes?"+q.Encode(), "", nil, &p)
}

// Lifecycle sends start, stop, suspend or resume.
func (c *Client) Lifecycle(ctx context.Context, verb, id string, restartIfRestoreFails bool, key string) (events.View, error) {
	var body any
	if restartIfRestoreFails {
		body = ResumeOptions{RestartIfRestoreFails: true}
	}
	var v events.View
	return v, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+verb, key, body, &v)
}

// ResumeOptions are resume's options (CONTRACT §5).
type ResumeOptions struct {
	// RestartIfRestoreFails: a cold start if the retained state is lost.
	RestartIfRestoreFails bool `json:"restart_if_restore_fails,omitempty"`
	// Node resumes on another node than the sandbox's, where its driver
	// can move the retained state (else FAILED_PRECONDITION).
	Node string `json:"node,omitempty"`
}

// Resume resumes a suspended sandbox with options o.
func (c *Client) Resume(ctx context.Context, id string, o ResumeOptions, key string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/resume", key, o, &v)
}

// Delete deletes a sandbox.
func (c *Client) Delete(ctx context.Context, id, key string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), key, nil, &v)
}

// History returns the audit history of a sandbox after seq.
func (c *Client) History(ctx context.Context, id string, after uint64) ([]Event, error) {
	var out events.History
	return out.Items, c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/sandboxes/%s/events?after=%d", url.PathEscape(id), after), "", nil, &out)
}

// Wait returns when the sandbox reaches phase, or DEADLINE_EXCEEDED after timeout.
func (c *Client) Wait(ctx context.Context, id string, phase events.Phase, timeout time.Duration) (events.View, error) {
	return c.WaitAfter(ctx, id, phase, 0, timeout)
}

// WaitAfter is Wait for a view at a sequence above after: pass the sequence
// a command answered with, so that the view from before it does not count.
func (c *Client) WaitAfter(ctx context.Context, id string, phase events.Phase, after uint64, timeout time.Duration) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/sandboxes/%s/wait?phase=%s&after=%d&timeout=%s", url.PathEscape(id), phase, after, timeout), "", nil, &v)
}

// Logs returns the last tail lines of a sandbox's workload output.
func (c *Client) Logs(ctx context.Context, id string, tail int) ([]byte, error) {
	var out rawBody
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/sandboxes/%s/logs?tail=%d", url.PathEscape(id), tail), "", nil, &out)
	return out, err
}

// Driver is one driver the server runs, with what it can do.
type Driver struct {
	Name         string `json:"name"`
	Capabilities struct {
		Suspend         bool   `json:"suspend"`
		ResumeElsewhere bool   `json:"resume_on_another_node"`
		Retains         string `json:"retains"`
	} `json:"capabilities"`
}

// Drivers lists the server's drivers.
func (c *Client) Drivers(ctx context.Context) ([]Driver, error) {
	var out struct {
		Items []Driver `json:"items"`
	}
	return out.Items, c.do(ctx, http.MethodGet, "/v1/drivers", "", nil, &out)
}

// Phases returns the count of sandboxes per phase.
func (c *Client) Phases(ctx context.Context) (map[events.Phase]int, error) {
	var m map[events.Phase]int
	return m, c.do(ctx, http.MethodGet, "/v1/phases", "", nil, &m)
}

// answerError is the error of an answer with a status of 300 or more: the
// contract error of its body, or one of the status's code.
func answerError(method, path string, resp *http.Response, data []byte) error {
	var eb events.ErrorBody
	if json.Unmarshal(data, &eb) == nil && eb.Error != nil {
		return eb.Error
	}
	code := events.CodeInternal
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		code = events.CodeUnavailable
	case http.StatusGatewayTimeout:
		code = events.CodeDeadlineExceeded
	case http.StatusNotFound:
		code = events.CodeNotFound
	}
	return events.Errorf(code, "%s %s: %s", method, path, resp.Status)
}
