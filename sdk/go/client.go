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

	"github.com/google/uuid"

	"github.com/torpor/torpor/events"
)

// Wire types shared with the server.
type (
	CreateRequest = events.CreateRequest
	Page          = events.Page
	Event         = events.HistoryEntry
	// IdlePolicy is create's idle and the view's (README "Idle and wake").
	IdlePolicy = events.IdlePolicy
)

// rawBody is an answer taken as it is (text), not decoded.
type rawBody []byte

// The verbs of the lifecycle commands (CONTRACT §4), for Lifecycle.
const (
	VerbCreate  = "create"
	VerbStart   = "start"
	VerbStop    = "stop"
	VerbSuspend = "suspend"
	VerbResume  = "resume"
	VerbDelete  = "delete"
	// VerbTouch records activity (Client.Touch, Bus.Touch); not a
	// lifecycle verb: it changes no phase.
	VerbTouch = "touch"
)

// orKey is key, or a fresh idempotency key (a uuid v7) when key is "".
func orKey(key string) string {
	if key != "" {
		return key
	}
	return uuid.Must(uuid.NewV7()).String()
}

// Client is the client of one torpor server's HTTP API; it is safe for
// concurrent use.
type Client struct {
	base  string
	hc    *http.Client
	token string
}

// WithToken returns a client like c that sends token as its bearer token
// (Authorization: Bearer …) on every request: the server answers
// UNAUTHENTICATED without one, and PERMISSION_DENIED to a token without the
// scope a call wants (read for reads, write for commands, admin for the
// rest).
func (c *Client) WithToken(token string) *Client {
	cc := *c
	cc.token = token
	return &cc
}

// newRequest is a request to the server, with the client's token.
func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// New returns a client of the server at base (e.g. "http://127.0.0.1:8080")
// through hc; a nil hc is a client whose transport keeps up to 64 idle
// connections to the server (Go's default keeps 2).
func New(base string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Transport: defaultTransport}
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return &Client{base: strings.TrimRight(base, "/"), hc: hc}
}

// defaultTransport is the transport of a client made without one: Go's
// default, keeping up to 64 idle connections to the server rather than 2,
// so that a program with many calls in flight (waits are long polls) reuses
// its connections instead of opening one for nearly every request.
var defaultTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 64, 64
	return t
}()

// do sends a request and decodes a JSON answer into out; a contract error
// body comes back as *events.Error. A request that got no answer, or the
// answer UNAVAILABLE or ABORTED, is sent again a few times with backoff, with
// the same idempotency key (commands) or as it is (reads); a change without
// a key that got no answer is not (sentOnce).
func (c *Client) do(ctx context.Context, method, path, key string, body, out any) error {
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			return events.Errorf(events.CodeInvalidArgument, "%s %s: encode body: %v", method, path, err)
		}
	}
	_, err := retry(ctx, func() (struct{}, error) {
		return struct{}{}, c.once(ctx, method, path, key, data, body != nil, out)
	})
	return err
}

// once sends a request once.
func (c *Client) once(ctx context.Context, method, path, key string, body []byte, hasBody bool, out any) error {
	var rd io.Reader
	if hasBody {
		rd = bytes.NewReader(body)
	}
	req, err := c.newRequest(ctx, method, path, rd)
	if err != nil {
		return err
	}
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	noAnswer := func(err error) error {
		err = transportError(ctx, method+" "+path, err)
		if method != http.MethodGet && key == "" {
			return sentOnce{err}
		}
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return noAnswer(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return noAnswer(err)
	}
	if resp.StatusCode >= 300 {
		if v, ok := out.(*events.View); ok {
			// A command with ?wait=true that timed out says the view
			// as it is beside its error (CONTRACT §5).
			var tb struct {
				View *events.View `json:"view"`
			}
			if json.Unmarshal(data, &tb) == nil && tb.View != nil {
				*v = *tb.View
			}
		}
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

// Create creates a sandbox. key is its idempotency key: a create sent
// again with the same key creates nothing more and answers the same
// sandbox; "" makes a fresh one, which the client's own retries reuse.
func (c *Client) Create(ctx context.Context, r CreateRequest, key string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodPost, "/v1/sandboxes", orKey(key), r, &v)
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

// List lists sandboxes in creation order; phase and label ("k=v") filter
// when set. ListWith takes the other filters and the sorts.
func (c *Client) List(ctx context.Context, phase, label string, limit int, cursor string) (Page, error) {
	return c.ListWith(ctx, ListOptions{Phase: phase, Label: label, Limit: limit, Cursor: cursor})
}

// ListOptions select and order a list (CONTRACT §5); the zero value lists
// every sandbox in creation order, a page of the server's default size.
type ListOptions struct {
	// Phase and Label ("k=v") keep sandboxes in that phase, with that label.
	Phase, Label string
	// Name keeps sandboxes whose name contains it, in any case.
	Name string
	// Driver and Node keep sandboxes of that driver, on that node.
	Driver, Node string
	// Sort is "created" (the default), "name", "-name", "age" (the
	// longest in its phase first) or "-age"; another is INVALID_ARGUMENT.
	Sort string
	// Limit is the page size (1 to 1000; 0 is the server's default).
	Limit int
	// Cursor is the Next of the page before, listed with the same Sort
	// (a cursor of another sort is INVALID_ARGUMENT).
	Cursor string
}

// ListWith lists sandboxes as o says; the page's Total is how many match
// over all pages.
func (c *Client) ListWith(ctx context.Context, o ListOptions) (Page, error) {
	q := url.Values{}
	for k, v := range map[string]string{"phase": o.Phase, "label": o.Label, "name": o.Name, "driver": o.Driver,
		"node": o.Node, "sort": o.Sort, "cursor": o.Cursor} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	var p Page
	return p, c.do(ctx, http.MethodGet, "/v1/sandboxes?"+q.Encode(), "", nil, &p)
}

// Lifecycle sends start, stop, suspend or resume (or delete) to sandbox
// id and answers its view as the command left it; key is the idempotency
// key ("" makes one). Start, Stop, Suspend, Resume and Delete are the
// same, one verb each.
func (c *Client) Lifecycle(ctx context.Context, verb, id string, restartIfRestoreFails bool, key string) (events.View, error) {
	if verb == VerbDelete {
		return c.Delete(ctx, id, key)
	}
	var body any
	if restartIfRestoreFails {
		body = ResumeOptions{RestartIfRestoreFails: true}
	}
	var v events.View
	return v, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+verb, orKey(key), body, &v)
}

// LifecycleWait sends start, stop, suspend, resume (with o) or delete to
// sandbox id with ?wait=true, and answers, in one round trip, the view once
// the command's outcome is in it: the first view after the command whose
// phase is not transient (the target, or where the sandbox settled instead:
// ready after a rejected suspend, suspended after a failed resume, error).
// A refused command answers its error at once. timeout bounds the wait
// (0: the server's default, 30s; at most 10m), and so does ctx's deadline
// when sooner; once it passes the error is DEADLINE_EXCEEDED and the view
// the one the server saw last (the command was accepted and goes on). key
// is the idempotency key ("" makes one): a retry with it waits for the same
// outcome. Lifecycle then Wait (or WaitAfter) is the two-call form.
func (c *Client) LifecycleWait(ctx context.Context, verb, id string, o ResumeOptions, key string, timeout time.Duration) (events.View, error) {
	method, path := http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/"+verb
	var body any
	switch verb {
	case VerbDelete:
		method, path = http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id)
	case VerbResume:
		body = o
	default:
		if o != (ResumeOptions{}) {
			return events.View{}, events.Errorf(events.CodeInvalidArgument, "%s %s: resume options are resume's", verb, id)
		}
	}
	var v events.View
	return v, c.do(ctx, method, path+"?"+waitQuery(ctx, timeout), orKey(key), body, &v)
}

// CreateWait is Create with ?wait=true: it answers the view once the new
// sandbox has settled (ready, or error), as LifecycleWait does.
func (c *Client) CreateWait(ctx context.Context, r CreateRequest, key string, timeout time.Duration) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodPost, "/v1/sandboxes?"+waitQuery(ctx, timeout), orKey(key), r, &v)
}

// waitQuery is the query of a command that waits for its outcome for
// timeout (0: the server's default), cut to ctx's deadline and to the
// server's cap: the server answers DEADLINE_EXCEEDED, with the view, before
// ctx ends.
func waitQuery(ctx context.Context, timeout time.Duration) string {
	if dl, ok := ctx.Deadline(); ok {
		left := max(time.Until(dl).Truncate(time.Millisecond), time.Millisecond)
		if timeout <= 0 || left < timeout {
			timeout = left
		}
	}
	if timeout <= 0 {
		return "wait=true"
	}
	return "wait=true&timeout=" + min(timeout, maxPoll).String()
}

// Start starts a stopped sandbox (cold), or a suspended one, discarding
// its retained state; on a ready sandbox it does nothing more.
func (c *Client) Start(ctx context.Context, id string) (events.View, error) {
	return c.Lifecycle(ctx, VerbStart, id, false, "")
}

// Stop stops a ready sandbox; on a stopped one it does nothing more.
func (c *Client) Stop(ctx context.Context, id string) (events.View, error) {
	return c.Lifecycle(ctx, VerbStop, id, false, "")
}

// Suspend suspends a ready sandbox, keeping a retained state to resume
// from; on a suspended one it does nothing more. A driver that cannot
// suspend answers UNIMPLEMENTED.
func (c *Client) Suspend(ctx context.Context, id string) (events.View, error) {
	return c.Lifecycle(ctx, VerbSuspend, id, false, "")
}

// ResumeOptions are resume's options (CONTRACT §5).
type ResumeOptions struct {
	// RestartIfRestoreFails: a cold start if the retained state is lost.
	RestartIfRestoreFails bool `json:"restart_if_restore_fails,omitempty"`
	// Node resumes on another node than the sandbox's, where its driver
	// can move the retained state (else FAILED_PRECONDITION).
	Node string `json:"node,omitempty"`
}

// Resume resumes a suspended sandbox with options o; key is the
// idempotency key ("" makes one).
func (c *Client) Resume(ctx context.Context, id string, o ResumeOptions, key string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/resume", orKey(key), o, &v)
}

// Delete deletes a sandbox; key is the idempotency key ("" makes one).
func (c *Client) Delete(ctx context.Context, id, key string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), orKey(key), nil, &v)
}

// Touch records activity of sandbox id (README "Activity"): a
// sandbox.active of source touch, unless one was recorded within the
// server's activity window (then nothing more), and answers its view,
// whose LastActiveAt it sets; key is the idempotency key ("" makes one).
// A sandbox deleting, deleted or in error answers FAILED_PRECONDITION.
func (c *Client) Touch(ctx context.Context, id, key string) (events.View, error) {
	var v events.View
	return v, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/touch", orKey(key), nil, &v)
}

// History returns the audit history of a sandbox after seq.
func (c *Client) History(ctx context.Context, id string, after uint64) ([]Event, error) {
	var out events.History
	return out.Items, c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/sandboxes/%s/events?after=%d", url.PathEscape(id), after), "", nil, &out)
}

// Wait returns the view of sandbox id once it is in phase. timeout bounds
// the wait (DEADLINE_EXCEEDED once it passes); 0 waits as long as ctx
// lasts. A sandbox that reaches a terminal phase other than phase answers
// FAILED_PRECONDITION: it will never get there.
func (c *Client) Wait(ctx context.Context, id string, phase events.Phase, timeout time.Duration) (events.View, error) {
	return c.WaitAfter(ctx, id, phase, 0, timeout)
}

// WaitAfter is Wait for a view at a sequence above after: pass the sequence
// a command answered with, so that the view from before it does not count.
//
// It loops over the server's long poll (each at most maxPoll, the server's
// cap), so a wait may last longer than one poll, and polls again after a
// dropped connection.
func (c *Client) WaitAfter(ctx context.Context, id string, phase events.Phase, after uint64, timeout time.Duration) (events.View, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	backoff := minBackoff
	for {
		poll := maxPoll
		if dl, ok := ctx.Deadline(); ok {
			// Let the server answer DEADLINE_EXCEEDED before ctx ends.
			poll = min(poll, max(time.Until(dl).Truncate(time.Millisecond), time.Millisecond))
		}
		var v events.View
		err := c.once(ctx, http.MethodGet, fmt.Sprintf("/v1/sandboxes/%s/wait?phase=%s&after=%d&timeout=%s",
			url.PathEscape(id), url.QueryEscape(string(phase)), after, poll), "", nil, false, &v)
		switch {
		case err == nil:
			return v, nil
		case ctx.Err() != nil:
			return v, transportError(ctx, "wait for "+id+" to be "+string(phase), ctx.Err())
		case events.CodeOf(err) == events.CodeDeadlineExceeded && poll < maxPoll:
			return v, err // the wait's own deadline: the server says where the sandbox is
		case events.CodeOf(err) == events.CodeDeadlineExceeded:
			backoff = minBackoff
			continue // one poll is over, not the wait
		case !retryable(err):
			return v, err
		}
		if err := sleep(ctx, backoff); err != nil {
			return v, transportError(ctx, "wait for "+id+" to be "+string(phase), err)
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// maxPoll is the longest long poll the server takes (its wait's timeout cap).
const maxPoll = 10 * time.Minute

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

// Server is what a server says of itself (GET /v1/server).
type Server struct {
	// Node is the node the server runs as (serve --node).
	Node string `json:"node"`
	// DeadlineSeconds is the deadline of its transient phases (serve
	// --deadline): a sandbox in one for longer is moved on by the server.
	DeadlineSeconds float64 `json:"deadline_seconds"`
	// ReadFrom is the view its reads come from: "kv" or "sql".
	ReadFrom string `json:"read_from"`
}

// Deadline is DeadlineSeconds as a duration.
func (s Server) Deadline() time.Duration {
	return time.Duration(s.DeadlineSeconds * float64(time.Second))
}

// Server asks the server what it is: its node, its deadline, its view. A
// server older than this call answers ErrNotFound.
func (c *Client) Server(ctx context.Context) (Server, error) {
	var s Server
	return s, c.do(ctx, http.MethodGet, "/v1/server", "", nil, &s)
}

// LogSandboxes lists the id of every sandbox the server's log holds
// (GET /v1/log/sandboxes): read from the event stream's subjects, not from
// a view, deleted sandboxes too. A server older than this call answers
// ErrNotFound.
func (c *Client) LogSandboxes(ctx context.Context) ([]string, error) {
	var out struct {
		Items []string `json:"items"`
	}
	return out.Items, c.do(ctx, http.MethodGet, "/v1/log/sandboxes", "", nil, &out)
}

// WhoAmI is what a server says of the token a request came with (GET
// /v1/whoami): its name and scopes. A server without authentication (serve
// --no-auth) answers every scope and no name.
type WhoAmI struct {
	Name   string  `json:"name"`
	Scopes []Scope `json:"scopes"`
}

// WhoAmI asks the server whose token the client sends and what it may do
// (read scope). A server older than this call answers ErrNotFound.
func (c *Client) WhoAmI(ctx context.Context) (WhoAmI, error) {
	var w WhoAmI
	return w, c.do(ctx, http.MethodGet, "/v1/whoami", "", nil, &w)
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

// Wire types of the token endpoints (admin tokens only).
type (
	Scope        = events.Scope
	TokenRequest = events.TokenRequest
	TokenInfo    = events.TokenInfo
	NewToken     = events.NewToken
)

// The scopes a token may hold: admin holds every scope.
const (
	ScopeRead  = events.ScopeRead
	ScopeWrite = events.ScopeWrite
	ScopeAdmin = events.ScopeAdmin
)

// CreateToken makes a bearer token (POST /v1/tokens); its secret is in the
// answer and nowhere else (the server keeps a hash). A name in use is
// ErrAlreadyExists.
func (c *Client) CreateToken(ctx context.Context, r TokenRequest) (NewToken, error) {
	var t NewToken
	return t, c.do(ctx, http.MethodPost, "/v1/tokens", "", r, &t)
}

// Tokens lists the server's tokens, without their secrets.
func (c *Client) Tokens(ctx context.Context) ([]TokenInfo, error) {
	var out struct {
		Items []TokenInfo `json:"items"`
	}
	return out.Items, c.do(ctx, http.MethodGet, "/v1/tokens", "", nil, &out)
}

// RevokeToken revokes the token named name: every server refuses it from
// then on. An unknown name is ErrNotFound.
func (c *Client) RevokeToken(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(name), "", nil, nil)
}
