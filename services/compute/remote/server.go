package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// Server answers the driver operations of one node on the bus (the package
// comment says how). Serve starts one; it serves until its context ends or
// Stop is called.
type Server struct {
	nc      *nats.Conn
	node    string
	drivers compute.Registry
	log     zerolog.Logger
	svc     micro.Service
	sub     *nats.Subscription // the catch-all of unknown operations

	mu       sync.Mutex
	stopping bool           // no call starts any more
	unwatch  func() bool    // releases the watch of Serve's context
	calls    sync.WaitGroup // the calls under way

	once    sync.Once
	err     error         // of Stop
	stopped chan struct{} // closed when Stop is done
	// from is the inbox prefix every request must be answered on ("":
	// any), OnlyFrom.
	from string
}

// ServeOption configures Serve.
type ServeOption func(*Server)

// OnlyFrom serves only requests answered on inbox (the service's,
// busauth.ServiceInbox): on a bus with accounts, a request answered
// elsewhere is not the service's (a push consumer's delivery another
// node's driver aimed here) and is refused PERMISSION_DENIED.
func OnlyFrom(inbox string) ServeOption { return func(s *Server) { s.from = inbox } }

// Serve answers the operations of node's drivers on nc until ctx ends or
// Stop is called. Its subscriptions are in place on the server when it
// returns: a request sent right after finds a responder. The driver calls
// run under ctx (ending it ends them) bounded by each request's timeout.
func Serve(ctx context.Context, nc *nats.Conn, node string, drivers compute.Registry, log zerolog.Logger, opts ...ServeOption) (*Server, error) {
	if err := checkNode(node); err != nil {
		return nil, err
	}
	if len(drivers) == 0 {
		return nil, events.Errorf(events.CodeInvalidArgument, "node %s: no drivers to serve", node)
	}
	s := &Server{nc: nc, node: node, drivers: drivers, log: log.With().Str("node", node).Logger(), stopped: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     "1.0.0",
		Description: "torpor's drivers of node " + node,
		Metadata:    map[string]string{"node": node, "drivers": strings.Join(drivers.Names(), ",")},
		QueueGroup:  QueueGroup,
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			s.log.Warn().Str("subject", e.Subject).Str("error", e.Description).Msg("driver service")
		},
	})
	if err != nil {
		return nil, fmt.Errorf("driver service of node %s: %w", node, err)
	}
	s.svc = svc
	for _, op := range Ops {
		if err := svc.AddEndpoint(op, s.endpoint(ctx, op), micro.WithEndpointSubject(Subject(node, op))); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("driver service of node %s, endpoint %s: %w", node, op, err)
		}
	}
	if s.sub, err = nc.QueueSubscribe(Prefix(node)+">", CatchAllQueueGroup, s.unknown); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("driver service of node %s: %w", node, err)
	}
	// A round trip, so that the subscriptions are in place when Serve returns.
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		_ = svc.Stop()
		_ = s.sub.Unsubscribe()
		return nil, fmt.Errorf("driver service of node %s: %w", node, err)
	}
	s.mu.Lock()
	s.unwatch = context.AfterFunc(ctx, func() { _ = s.Stop() })
	s.mu.Unlock()
	return s, nil
}

// Stop stops taking requests and waits for the calls under way (each ends
// by its timeout at the latest; ending Serve's context ends them at once).
// A request that arrives meanwhile is answered UNAVAILABLE, which a Client
// takes as no answer: another process serving the node may take it. When
// Stop returns the server knows the node's subscriptions are gone: a
// request then finds no responders (or another process serving the node).
// Stop may be called more than once.
func (s *Server) Stop() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.stopping = true
		unwatch := s.unwatch
		s.mu.Unlock()
		if unwatch != nil {
			unwatch()
		}
		err := s.svc.Stop()
		if e := s.sub.Drain(); e != nil && !errors.Is(e, nats.ErrConnectionClosed) {
			err = errors.Join(err, e)
		}
		// A round trip: the server has the unsubscriptions.
		if e := s.nc.FlushTimeout(10 * time.Second); e != nil && !errors.Is(e, nats.ErrConnectionClosed) {
			err = errors.Join(err, e)
		}
		s.calls.Wait()
		s.err = err
		close(s.stopped)
	})
	return s.err
}

// Done is closed when the server has stopped (Stop, or the end of Serve's
// context).
func (s *Server) Done() <-chan struct{} { return s.stopped }

// enter counts a call in, unless the server is stopping.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false
	}
	s.calls.Add(1)
	return true
}

// endpoint is the handler of op's endpoint: micro calls it serially, so it
// hands each request to a goroutine of its own and returns.
func (s *Server) endpoint(ctx context.Context, op string) micro.HandlerFunc {
	return func(req micro.Request) {
		reply, data := req.Reply(), req.Data()
		if reply == "" {
			return // a publish: nobody asked for the outcome
		}
		if s.from != "" && !strings.HasPrefix(reply, s.from+".") {
			s.answer(reply, Reply{Error: &Error{Code: events.CodePermissionDenied,
				Message: fmt.Sprintf("the drivers of node %s serve the service's requests only (answered on %s)", s.node, s.from)}})
			return
		}
		if !s.enter() {
			s.answer(reply, Reply{Error: &Error{Code: events.CodeUnavailable, Kind: KindUnavailable,
				Message: fmt.Sprintf("the drivers of node %s are stopping: %s", s.node, compute.ErrUnavailable)}})
			return
		}
		// The answer goes out from here, not through req: micro reads what
		// req recorded of its answer when the handler returns.
		go func() {
			defer s.calls.Done()
			s.answer(reply, s.serve(ctx, op, data))
		}()
	}
}

// unknown answers an operation no endpoint serves with UNIMPLEMENTED, and
// leaves the known ones to their endpoints.
func (s *Server) unknown(m *nats.Msg) {
	op := strings.TrimPrefix(m.Subject, Prefix(s.node))
	if slices.Contains(Ops, op) || m.Reply == "" {
		return
	}
	s.answer(m.Reply, Reply{Error: &Error{Code: events.CodeUnimplemented, Kind: KindUnimplemented,
		Message: fmt.Sprintf("the drivers of node %s know no operation %q (they know %s): %s", s.node, op, strings.Join(Ops, ", "), compute.ErrUnimplemented)}})
}

// serve decodes one request of op and makes its driver call.
func (s *Server) serve(ctx context.Context, op string, data []byte) Reply {
	var req Request
	if err := json.Unmarshal(data, &req); err != nil {
		return Reply{Error: errorOf(events.Errorf(events.CodeInvalidArgument, "%s request to node %s: %v", op, s.node, err))}
	}
	if req.Driver == "" {
		return Reply{Error: errorOf(events.Errorf(events.CodeInvalidArgument, "%s request to node %s names no driver", op, s.node))}
	}
	d, ok := s.drivers[req.Driver]
	if !ok {
		return Reply{Error: errorOf(events.Errorf(events.CodeNotFound, "node %s has no driver %q (it has %s)", s.node, req.Driver, strings.Join(s.drivers.Names(), ", ")))}
	}
	if sp := specOf(req); sp != nil && sp.Node != "" && sp.Node != s.node {
		// Only the owning node acts on a sandbox: a call meant for another
		// node's copy (a stale route, a node renamed) changes nothing here.
		return Reply{Error: errorOf(events.Errorf(events.CodeFailedPrecondition, "%s of sandbox %s: it is on node %s, not on %s: only its own node acts on it", op, sp.SandboxID, sp.Node, s.node))}
	}
	if req.TimeoutMS < 0 {
		return Reply{Error: errorOf(events.Errorf(events.CodeInvalidArgument, "%s request to node %s: timeout_ms %d is negative", op, s.node, req.TimeoutMS))}
	}
	timeout := DefaultTimeout
	if req.TimeoutMS > 0 {
		timeout = min(time.Duration(req.TimeoutMS)*time.Millisecond, MaxTimeout)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	began := time.Now()
	rep, err := call(cctx, op, req, d, s.lacks(req.Driver))
	lc := s.log.With().Str("op", op).Str("driver", req.Driver).Dur("took", time.Since(began))
	if id, gen := about(req); id != "" {
		lc = lc.Str("sandbox_id", id).Int64("generation", gen)
	}
	log := lc.Logger()
	switch {
	case err == nil:
		log.Debug().Msg("driver call")
	case cctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		why := fmt.Sprintf("not done within %s", timeout)
		if ctx.Err() != nil {
			why = "ended by the stop of the driver server"
		}
		log.Warn().Err(err).Msg("driver call " + why)
		rep.Error = &Error{Code: events.CodeUnavailable, Kind: KindUnavailable,
			Message: fmt.Sprintf("%s of driver %s on node %s %s: %v: %s", op, req.Driver, s.node, why, err, compute.ErrUnavailable)}
	default:
		log.Debug().Err(err).Msg("driver call")
		rep.Error = errorOf(err)
	}
	return rep
}

// lacks is the error of a call on driver name for an optional interface it
// does not have: what it cannot do (it "cannot suspend").
func (s *Server) lacks(name string) func(what string) error {
	return func(what string) error {
		return fmt.Errorf("driver %s on node %s %s: %w", name, s.node, what, compute.ErrUnimplemented)
	}
}

// about is the sandbox and generation req is about, for the log.
func about(req Request) (id string, gen int64) {
	switch {
	case req.Start != nil:
		return req.Start.Spec.SandboxID, req.Start.Generation
	case req.Target != nil:
		return req.Target.Spec.SandboxID, req.Target.Generation
	case req.Resume != nil:
		return req.Resume.Spec.SandboxID, req.Resume.Generation
	case req.Spec != nil:
		return req.Spec.SandboxID, 0
	}
	return "", 0
}

// specOf is the spec of the sandbox req is about, if it names one.
func specOf(req Request) *compute.Spec {
	switch {
	case req.Start != nil:
		return &req.Start.Spec
	case req.Target != nil:
		return &req.Target.Spec
	case req.Resume != nil:
		return &req.Resume.Spec
	}
	return req.Spec
}

// missing is the refusal of an op request that lacks its argument field.
func missing(op, field string) error {
	return events.Errorf(events.CodeInvalidArgument, "a %s request carries %q", op, field)
}

// call makes op's call of d with req's arguments; lacks makes the error of
// an optional interface d does not have.
func call(ctx context.Context, op string, req Request, d compute.Driver, lacks func(string) error) (Reply, error) {
	needSpec := func() error {
		if req.Spec == nil {
			return missing(op, "spec")
		}
		return nil
	}
	suspender := func() (compute.Suspender, error) {
		if sus, ok := d.(compute.Suspender); ok {
			return sus, nil
		}
		return nil, lacks("cannot suspend or resume")
	}
	switch op {
	case OpCapabilities:
		c := compute.CapabilitiesOf(d, req.Options)
		return Reply{Capabilities: &c}, nil
	case OpValidate:
		if err := needSpec(); err != nil {
			return Reply{}, err
		}
		if v, ok := d.(compute.SpecValidator); ok {
			return Reply{}, v.ValidateSpec(*req.Spec)
		}
		return Reply{}, nil
	case OpStart:
		if req.Start == nil {
			return Reply{}, missing(op, "start")
		}
		return Reply{}, d.Start(ctx, *req.Start)
	case OpStop:
		if req.Target == nil {
			return Reply{}, missing(op, "target")
		}
		return Reply{}, d.Stop(ctx, *req.Target)
	case OpDelete:
		if err := needSpec(); err != nil {
			return Reply{}, err
		}
		return Reply{}, d.Delete(ctx, *req.Spec)
	case OpSuspend:
		if req.Target == nil {
			return Reply{}, missing(op, "target")
		}
		sus, err := suspender()
		if err != nil {
			return Reply{}, err
		}
		ref, err := sus.Suspend(ctx, *req.Target)
		return Reply{Ref: ref}, err
	case OpResume:
		if req.Resume == nil {
			return Reply{}, missing(op, "resume")
		}
		sus, err := suspender()
		if err != nil {
			return Reply{Resume: &compute.ResumeResult{}}, err
		}
		res, err := sus.Resume(ctx, *req.Resume)
		return Reply{Resume: &res}, err
	case OpDiscard:
		if err := needSpec(); err != nil {
			return Reply{}, err
		}
		sus, err := suspender()
		if err != nil {
			return Reply{}, err
		}
		return Reply{}, sus.Discard(ctx, *req.Spec, req.Ref)
	case OpExport:
		if err := needSpec(); err != nil {
			return Reply{}, err
		}
		ex, ok := d.(compute.Exporter)
		if !ok {
			return Reply{}, lacks("cannot export retained states")
		}
		ref, err := ex.Export(ctx, *req.Spec, req.Ref)
		return Reply{Ref: ref}, err
	case OpObserve:
		if err := needSpec(); err != nil {
			return Reply{}, err
		}
		ob, ok := d.(compute.Observer)
		if !ok {
			return Reply{}, lacks("cannot observe")
		}
		o, err := ob.Observe(ctx, *req.Spec)
		return Reply{Observation: &o}, err
	case OpLogs:
		if err := needSpec(); err != nil {
			return Reply{}, err
		}
		l, ok := d.(compute.Logger)
		if !ok {
			return Reply{}, lacks("keeps no output")
		}
		b, err := l.Logs(ctx, *req.Spec, req.Tail)
		return Reply{Logs: b}, err
	case OpCheck:
		if err := needSpec(); err != nil {
			return Reply{}, err
		}
		ch, ok := d.(compute.Checker)
		if !ok {
			return Reply{}, lacks("cannot say whether it can restore a retained state")
		}
		return Reply{}, ch.CanRestore(ctx, *req.Spec, req.Ref)
	case OpAwaitExport:
		if err := needSpec(); err != nil {
			return Reply{}, err
		}
		a, ok := d.(compute.ExportAwaiter)
		if !ok {
			return Reply{}, lacks("exports nothing ahead")
		}
		via, n, err := a.AwaitExport(ctx, *req.Spec, req.Ref)
		return Reply{Ref: via, Bytes: n}, err
	}
	return Reply{}, events.Errorf(events.CodeUnimplemented, "no operation %q: %w", op, compute.ErrUnimplemented)
}

// headroom is what an answer leaves of the max payload for its headers.
const headroom = 2048

// answer sends rep to reply; an error also goes in micro's error headers.
// An answer too large for the bus is replaced by a RESOURCE_EXHAUSTED
// error.
func (s *Server) answer(reply string, rep Reply) {
	data, err := json.Marshal(rep)
	if err == nil && int64(len(data))+headroom > s.nc.MaxPayload() {
		rep = Reply{Error: &Error{Code: events.CodeResourceExhausted,
			Message: fmt.Sprintf("an answer of %d bytes does not fit the bus's max payload of %d (ask for fewer log lines)", len(data), s.nc.MaxPayload())}}
		data, err = json.Marshal(rep)
	}
	if err != nil {
		s.log.Error().Err(err).Msg("driver answer not encoded")
		return
	}
	msg := &nats.Msg{Subject: reply, Data: data}
	if rep.Error != nil {
		msg.Header = nats.Header{
			micro.ErrorHeader:     []string{headerValue(rep.Error.Message)},
			micro.ErrorCodeHeader: []string{strconv.Itoa(rep.Error.ContractCode().HTTPStatus())},
		}
	}
	if err := s.nc.PublishMsg(msg); err != nil {
		s.log.Warn().Err(err).Msg("driver answer not sent")
	}
}

// headerValue is s fit for a header: one line, not too long, not empty.
func headerValue(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 512 {
		s = strings.ToValidUTF8(s[:512], "")
	}
	if s == "" {
		s = "error"
	}
	return s
}
