package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

var (
	_ compute.Driver        = (*Client)(nil)
	_ compute.Suspender     = (*Client)(nil)
	_ compute.Observer      = (*Client)(nil)
	_ compute.Logger        = (*Client)(nil)
	_ compute.SpecValidator = (*Client)(nil)
	_ compute.Exporter      = (*Client)(nil)
	_ compute.Dialer        = (*Client)(nil)
	_ compute.Checker       = (*Client)(nil)
	_ compute.ExportAwaiter = (*Client)(nil)
)

// How long a Client waits for an answer by default: LongTimeout for the
// calls that change a workload (start, stop, delete, suspend, resume,
// discard, export: a VM's resume takes a second or two, a process's stop
// waits out its grace), ShortTimeout for those that only look (capabilities,
// validate, observe, logs). A context with an earlier deadline waits less.
const (
	LongTimeout  = 30 * time.Second
	ShortTimeout = 5 * time.Second
)

// Client is driver Driver of node Node, called on the bus. It is every
// optional interface of compute (a driver the node serves that lacks one
// answers UNIMPLEMENTED), and a Dialer that refuses: forwards to a sandbox
// on another node are not built.
//
// An error a driver answered comes back as an *Error that wraps the same
// sentinel of compute and carries the same contract code; a call that got
// no answer (nobody serves the node, or none came in time) is an error
// wrapping compute.ErrUnavailable, which the sagas call again. A call that
// provably reached no node (NATS answered no responders, or the time was
// up before it was sent) wraps compute.ErrNotDelivered too: the node did
// nothing of it.
type Client struct {
	nc           *nats.Conn
	node, driver string
	long, short  time.Duration
	timeouts     map[string]time.Duration // per operation, over long and short
	nodeErr      error                    // the node names no subject
}

// Option changes a Client.
type Option func(*Client)

// WithTimeout makes every call of the Client wait d for its answer.
func WithTimeout(d time.Duration) Option {
	return func(c *Client) { c.long, c.short = d, d }
}

// WithOpTimeout makes calls of op (OpStart, …) wait d for their answer.
func WithOpTimeout(op string, d time.Duration) Option {
	return func(c *Client) { c.timeouts[op] = d }
}

// NewClient is driver of node, called on nc.
func NewClient(nc *nats.Conn, node, driver string, opts ...Option) *Client {
	c := &Client{nc: nc, node: node, driver: driver, long: LongTimeout, short: ShortTimeout, timeouts: map[string]time.Duration{}}
	for _, o := range opts {
		o(c)
	}
	c.nodeErr = checkNode(node)
	return c
}

// Node is the node the client calls.
func (c *Client) Node() string { return c.node }

// timeout is how long a call of op waits at most.
func (c *Client) timeout(op string) time.Duration {
	if d, ok := c.timeouts[op]; ok {
		return d
	}
	switch op {
	case OpCapabilities, OpValidate, OpObserve, OpLogs, OpCheck:
		// A check is the target's look at itself (its QEMU, memory and
		// disk): one whose request was lost (a server of the cluster gone
		// under it) is asked again soon, not after a resume's whole
		// deadline (TestClusterFaults/b saw a resume fail so).
		return c.short
	}
	return c.long
}

// call sends req as op and returns the reply; an error the driver answered
// is rep.Error.
func (c *Client) call(ctx context.Context, op string, req Request) (Reply, error) {
	if c.nodeErr != nil {
		return Reply{}, c.nodeErr
	}
	timeout := c.timeout(op)
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= 0 {
		return Reply{}, c.undelivered(op, context.DeadlineExceeded) // never sent
	}
	req.Driver = c.driver
	req.TimeoutMS = max(1, timeout.Milliseconds())
	data, err := json.Marshal(req)
	if err != nil {
		return Reply{}, fmt.Errorf("%s of driver %s on node %s: %w", op, c.driver, c.node, err)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := c.nc.RequestWithContext(rctx, Subject(c.node, op), data)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return Reply{}, c.undelivered(op, err)
	case err != nil:
		return Reply{}, c.unanswered(op, err)
	}
	var rep Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return Reply{}, events.Errorf(events.CodeInternal, "%s of driver %s on node %s: an answer that is no reply: %v", op, c.driver, c.node, err)
	}
	if rep.Error != nil {
		return rep, rep.Error
	}
	return rep, nil
}

// unanswered is the error of a call of op that got no answer for err: the
// node may have acted on it.
func (c *Client) unanswered(op string, err error) error {
	return fmt.Errorf("%s of driver %s on node %s: %w (%w)", op, c.driver, c.node, compute.ErrUnavailable, err)
}

// undelivered is the error of a call of op that reached no node, for err:
// nobody serves the node (NATS answered no responders), or it was never
// sent. It wraps compute.ErrNotDelivered, an ErrUnavailable.
func (c *Client) undelivered(op string, err error) error {
	return fmt.Errorf("%s of driver %s on node %s: %w (%w)", op, c.driver, c.node, compute.ErrNotDelivered, err)
}

// Capabilities asks the node what its driver can do with opts. It cannot
// say it failed: without an answer (within ShortTimeout) it is the zero
// Capabilities, which can do nothing optional, and nothing is logged (the
// call that then fails says why).
func (c *Client) Capabilities(opts map[string]string) compute.Capabilities {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout(OpCapabilities))
	defer cancel()
	rep, err := c.call(ctx, OpCapabilities, Request{Options: opts})
	if err != nil || rep.Capabilities == nil {
		return compute.Capabilities{}
	}
	return *rep.Capabilities
}

// ValidateSpec asks the node's driver whether it takes spec (within the
// validate timeout: the interface has no context).
func (c *Client) ValidateSpec(spec compute.Spec) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout(OpValidate))
	defer cancel()
	_, err := c.call(ctx, OpValidate, Request{Spec: &spec})
	return err
}

// Start asks the node to run req's generation.
func (c *Client) Start(ctx context.Context, req compute.Start) error {
	_, err := c.call(ctx, OpStart, Request{Start: &req})
	return err
}

// Stop asks the node to stop t's workload.
func (c *Client) Stop(ctx context.Context, t compute.Target) error {
	_, err := c.call(ctx, OpStop, Request{Target: &t})
	return err
}

// Delete asks the node to release everything of spec's sandbox.
func (c *Client) Delete(ctx context.Context, spec compute.Spec) error {
	_, err := c.call(ctx, OpDelete, Request{Spec: &spec})
	return err
}

// Suspend asks the node to retain t's workload and returns its reference.
func (c *Client) Suspend(ctx context.Context, t compute.Target) (string, error) {
	rep, err := c.call(ctx, OpSuspend, Request{Target: &t})
	if err != nil {
		return "", err
	}
	return rep.Ref, nil
}

// Resume asks the node to restore req's reference; the result says whether
// it was consumed, on failure too (without an answer nothing is known, and
// it is the zero result).
func (c *Client) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	rep, err := c.call(ctx, OpResume, Request{Resume: &req})
	var res compute.ResumeResult
	if rep.Resume != nil {
		res = *rep.Resume
	}
	return res, err
}

// Discard asks the node to release the retained state behind ref.
func (c *Client) Discard(ctx context.Context, spec compute.Spec, ref string) error {
	_, err := c.call(ctx, OpDiscard, Request{Spec: &spec, Ref: ref})
	return err
}

// Export asks the node to make ref restorable anywhere.
func (c *Client) Export(ctx context.Context, spec compute.Spec, ref string) (string, error) {
	rep, err := c.call(ctx, OpExport, Request{Spec: &spec, Ref: ref})
	if err != nil {
		return "", err
	}
	return rep.Ref, nil
}

// Observe asks the node what is true of spec's sandbox.
func (c *Client) Observe(ctx context.Context, spec compute.Spec) (compute.Observation, error) {
	rep, err := c.call(ctx, OpObserve, Request{Spec: &spec})
	if err != nil {
		return compute.Observation{}, err
	}
	if rep.Observation == nil {
		return compute.Observation{}, events.Errorf(events.CodeInternal, "observe of driver %s on node %s: an answer without an observation", c.driver, c.node)
	}
	return *rep.Observation, nil
}

// Logs asks the node for the last tail lines of spec's workload's output.
func (c *Client) Logs(ctx context.Context, spec compute.Spec, tail int) ([]byte, error) {
	rep, err := c.call(ctx, OpLogs, Request{Spec: &spec, Tail: tail})
	if err != nil {
		return nil, err
	}
	return rep.Logs, nil
}

// Dial refuses: forwards to a sandbox on another node are not built.
func (c *Client) Dial(ctx context.Context, spec compute.Spec, port int) (net.Conn, error) {
	return nil, fmt.Errorf("port %d of %s: driver %s on node %s: forwards to another node are not built: %w", port, spec.SandboxID, c.driver, c.node, compute.ErrUnimplemented)
}

// CanRestore asks the node whether it can restore the retained state
// behind ref (compute.Checker). A node whose driver is no Checker, or
// that does not know the operation (an older torpor driver), answers
// UNIMPLEMENTED: compute.Routed then takes it as not asked. It waits as
// long as the calls that change a workload: a vm node may first probe its
// accelerator.
func (c *Client) CanRestore(ctx context.Context, spec compute.Spec, ref string) error {
	_, err := c.call(ctx, OpCheck, Request{Spec: &spec, Ref: ref})
	return err
}

// AwaitExport asks the node to wait for the export ahead of ref and to say
// what it made (compute.ExportAwaiter). Each call waits as long as the
// calls that change a workload (so that a driver server that stops waits
// no longer for it than for them); one that gets no answer in that time
// (an export that takes longer, a node restarting) is made again, after
// awaitBackoff, until ctx ends. A node that does not know the operation
// (an older torpor driver) answers UNIMPLEMENTED.
func (c *Client) AwaitExport(ctx context.Context, spec compute.Spec, ref string) (string, int64, error) {
	for {
		rep, err := c.call(ctx, OpAwaitExport, Request{Spec: &spec, Ref: ref})
		if err == nil {
			return rep.Ref, rep.Bytes, nil
		}
		if !errors.Is(err, compute.ErrUnavailable) || ctx.Err() != nil {
			return "", 0, err
		}
		t := time.NewTimer(awaitBackoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", 0, err
		}
	}
}

// awaitBackoff is the pause between two calls of an AwaitExport.
const awaitBackoff = 250 * time.Millisecond
