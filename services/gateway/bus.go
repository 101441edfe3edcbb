package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/internal/warm"
	"github.com/torpor/torpor/services/compute"
)

// Bus headers.
const (
	HeaderIdempotencyKey = "Torpor-Idempotency-Key"
	HeaderActor          = "Torpor-Actor"
)

// BusRequest is the body of a command on torpor.cmd.<verb> other than
// create, and of POST /v1/sandboxes/{id}/<verb> (where id may be left out).
type BusRequest struct {
	ID                    string `json:"id,omitempty"`
	RestartIfRestoreFails bool   `json:"restart_if_restore_fails,omitempty"`
	// Node is where a resume is to run, when not on the sandbox's node.
	Node string `json:"node,omitempty"`
}

// options puts br's options of verb into c, refusing those verb has not.
func (br BusRequest) options(verb string, c *Command) error {
	if verb != VerbResume && (br.RestartIfRestoreFails || br.Node != "") {
		return events.Errorf(events.CodeInvalidArgument, "restart_if_restore_fails and node are options of resume, not %s", verb)
	}
	c.RestartIfRestoreFails, c.ResumeOn = br.RestartIfRestoreFails, br.Node
	return nil
}

// Bus serves the commands as the NATS micro service "torpor" on
// torpor.cmd.<verb> (the lifecycle verbs and touch), and takes supervisor reports on torpor.supervisor.<id>.
type Bus struct {
	nc       *nats.Conn
	svc      *Service
	log      zerolog.Logger
	inflight chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	closed   bool       // Run is ending: spawn starts nothing
	warm     *warm.Pool // runs the commands on goroutines with grown stacks
	srv      micro.Service
	sub      *nats.Subscription
	beatSub  *nats.Subscription
	beats    beats
}

// NewBus returns the bus front of svc; at most parallel commands run at once.
func NewBus(nc *nats.Conn, svc *Service, parallel int, log zerolog.Logger) *Bus {
	if parallel < 1 {
		parallel = 256
	}
	return &Bus{nc: nc, svc: svc, log: log, inflight: make(chan struct{}, parallel), warm: warm.New(time.Second)}
}

// Version is the micro service version.
const Version = "0.1.0"

// Listen registers the micro service and the report subscription, so that
// requests are taken from the moment it returns; ctx bounds the requests they
// start. Run serves until ctx ends.
func (b *Bus) Listen(ctx context.Context) error {
	srv, err := micro.AddService(b.nc, micro.Config{
		Name: "torpor", Version: Version, Description: "sandbox lifecycle commands",
		QueueGroup: "torpor",
	})
	if err != nil {
		return fmt.Errorf("micro service: %w", err)
	}
	g := srv.AddGroup("torpor.cmd")
	for _, verb := range append(Verbs[:len(Verbs):len(Verbs)], VerbTouch) {
		if err := g.AddEndpoint(verb, b.handler(ctx, verb)); err != nil {
			_ = srv.Stop()
			return fmt.Errorf("endpoint %s: %w", verb, err)
		}
	}
	sub, err := b.nc.QueueSubscribe(compute.ReportSubject("*"), "torpor", func(m *nats.Msg) {
		b.spawn(ctx, func(ctx context.Context) { b.report(ctx, m) })
	})
	if err != nil {
		_ = srv.Stop()
		return fmt.Errorf("supervisor reports: %w", err)
	}
	beatSub, err := b.listenBeats()
	if err != nil {
		_ = sub.Unsubscribe()
		_ = srv.Stop()
		return fmt.Errorf("heartbeats: %w", err)
	}
	b.srv, b.sub, b.beatSub = srv, sub, beatSub
	// A round trip, so that the subscriptions are in place on the server
	// when Listen returns: a beat another gateway passes on right after
	// reaches this one too.
	if err := b.nc.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	return nil
}

// Run serves until ctx ends (calling Listen if it was not), then stops taking
// requests and waits for the ones under way.
func (b *Bus) Run(ctx context.Context) error {
	if b.srv == nil {
		if err := b.Listen(ctx); err != nil {
			return err
		}
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		b.watchBeats(ctx)
	}()
	<-ctx.Done()
	<-watched
	_ = b.beatSub.Unsubscribe()
	_ = b.sub.Drain()
	_ = b.srv.Stop()
	// Drain and Stop return before the last callbacks have run: from here
	// on spawn starts nothing (such a request goes unanswered; a client or
	// supervisor asks again), so nothing is added to wg while it is waited.
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
	b.warm.Close() // no goroutine of the pool outlives Run
	return nil
}

// spawn runs f in a goroutine (a warm one if one is idle) under the
// concurrency bound; Run waits for it.
func (b *Bus) spawn(ctx context.Context, f func(context.Context)) {
	select {
	case b.inflight <- struct{}{}:
	case <-ctx.Done():
		return
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.inflight
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	b.warm.Go(func() {
		defer func() { <-b.inflight; b.wg.Done() }()
		// Finish the request under way even while shutting down.
		f(context.WithoutCancel(ctx))
	})
}

// handler runs each command in a goroutine of its own, so that a slow one
// holds up no other. It answers on the request's reply subject itself, with
// the headers micro's Request.Error would set: micro reads what a request
// answered once the handler returns (for its stats), which races with an
// answer given later. The micro stats therefore count every request and
// the time to hand it over, not the errors.
func (b *Bus) handler(ctx context.Context, verb string) micro.HandlerFunc {
	return func(req micro.Request) {
		reply := req.Reply()
		b.spawn(ctx, func(ctx context.Context) {
			if reply == "" {
				_, _ = b.command(ctx, verb, req) // nobody waits for the answer
				return
			}
			v, err := b.command(ctx, verb, req)
			msg := &nats.Msg{Subject: reply}
			if err != nil {
				e := events.AsError(natserr.Classify(err))
				msg.Header = nats.Header{micro.ErrorHeader: []string{e.Message}, micro.ErrorCodeHeader: []string{string(e.Code)}}
				msg.Data, _ = json.Marshal(events.ErrorBody{Error: e})
			} else if msg.Data, err = json.Marshal(v); err != nil {
				b.log.Error().Err(err).Str("verb", verb).Msg("encode answer")
				return
			}
			if err := b.nc.PublishMsg(msg); err != nil {
				b.log.Debug().Err(err).Str("verb", verb).Msg("answer not sent")
			}
		})
	}
}

// HeaderRequestInfo is where the nats-server says who sent a request that
// came through an import that shares it: the commands of the clients'
// account (internal/busauth) carry it, set by the server, never by the
// client (the server replaces a header of that name a client sends).
const HeaderRequestInfo = "Nats-Request-Info"

// requestInfo is what the service reads of HeaderRequestInfo.
type requestInfo struct {
	Kind string   `json:"kind"`
	User string   `json:"user"`
	Name string   `json:"name_tag"`
	Tags []string `json:"tags"`
}

// sender is the actor of a command from the clients' account whose
// request info is info: "bus:<the user's name>". Only a client holding
// the producer role may command: anything else that reaches the command
// subjects through the import (a delivery of a push consumer a dashboard
// aimed there, which the server marks as JetStream's) is refused.
func sender(info string) (string, error) {
	var ri requestInfo
	if err := json.Unmarshal([]byte(info), &ri); err != nil {
		return "", events.Errorf(events.CodePermissionDenied, "a command whose sender the bus does not say")
	}
	if ri.Kind != "Client" || !slices.Contains(ri.Tags, "role:producer") {
		return "", events.Errorf(events.CodePermissionDenied, "commands come from producers (a %s sender without the producer role)", strings.ToLower(cmp.Or(ri.Kind, "nameless")))
	}
	return "bus:" + cmp.Or(ri.Name, ri.User), nil
}

func (b *Bus) command(ctx context.Context, verb string, req micro.Request) (events.View, error) {
	actor := "bus"
	if info := req.Headers().Get(HeaderRequestInfo); info != "" {
		// From the clients' account: the server says who sent it.
		var err error
		if actor, err = sender(info); err != nil {
			return events.View{}, err
		}
	} else {
		// From the torpor account: the service's own connections, whose
		// answers come on their inbox; a request answered elsewhere (a
		// push consumer's delivery a driver aimed here) is no command.
		if in := b.svc.cfg.ServiceInbox; in != "" && !strings.HasPrefix(req.Reply(), in+".") {
			return events.View{}, events.Errorf(events.CodePermissionDenied, "commands in torpor's account come from its own connections (answered on %s); producers send them from the clients' account", in)
		}
		if a := req.Headers().Get(HeaderActor); a != "" {
			actor = a
		}
	}
	c, err := decodeCommand(verb, req.Data(), b.svc.cfg.MaxBody)
	if err != nil {
		return events.View{}, err
	}
	c.Actor, c.IdempotencyKey = actor, req.Headers().Get(HeaderIdempotencyKey)
	return b.svc.Handle(ctx, c)
}

// decodeCommand is the command of verb in data, the body of a request on
// torpor.cmd.<verb> of at most max bytes, or why it is none
// (INVALID_ARGUMENT).
func decodeCommand(verb string, data []byte, max int64) (Command, error) {
	if int64(len(data)) > max {
		return Command{}, events.Errorf(events.CodeInvalidArgument, "body exceeds %d bytes", max)
	}
	c := Command{Verb: verb}
	if verb == VerbCreate {
		if err := decodeJSON(data, &c.Create); err != nil {
			return Command{}, err
		}
		return c, nil
	}
	var br BusRequest
	if err := decodeJSON(data, &br); err != nil {
		return Command{}, err
	}
	if br.ID == "" {
		return Command{}, events.Errorf(events.CodeInvalidArgument, "%s needs \"id\"", verb)
	}
	if err := br.options(verb, &c); err != nil {
		return Command{}, err
	}
	c.ID = br.ID
	return c, nil
}

// report records one supervisor report, if its credential is that of the
// generation it claims; a reply, when asked for, says whether it was taken.
// A heartbeat taken is passed on to every gateway, as is the attach of a
// new generation of a watched supervisor; an exit or a detach ends the watch
// of the supervisor's heartbeats.
func (b *Bus) report(ctx context.Context, m *nats.Msg) {
	id := strings.TrimPrefix(m.Subject, "torpor.supervisor.")
	r, err := b.svc.Report(ctx, id, m.Data)
	if err != nil {
		b.log.Debug().Err(err).Str("subject", m.Subject).Msg("supervisor report refused")
	} else {
		switch r.Kind {
		case compute.ReportHeartbeat:
			b.passOn(id, m.Data)
		case compute.ReportAttached:
			// Every gateway that watches the supervisor takes its attach
			// for a beat: a resumed generation's supervisor that heartbeat
			// as the older one is watched as the new one from its attach
			// (should it never beat as it, it falls silent like any
			// other), and one attached again after a detach is not found
			// silent, and detached again, by a gateway whose watch of the
			// old silence had yet to end.
			b.passOn(id, m.Data)
		case compute.ReportExited, compute.ReportDetached:
			b.beats.forget(id)
		}
	}
	if m.Reply == "" {
		return
	}
	if err != nil {
		body, _ := json.Marshal(events.ErrorBody{Error: events.AsError(natserr.Classify(err))})
		_ = m.Respond(body)
		return
	}
	_ = m.Respond([]byte(`{"ok":true}`))
}

// ReportsRefused is how many supervisor reports this gateway did not take:
// stale generations, bad credentials, malformed or misaddressed reports,
// reports the sandbox's phase does not take (and any it failed to record),
// not those answered ABORTED after waiting for a saga's record, which
// their supervisors send again.
func (s *Service) ReportsRefused() uint64 { return s.reportsRefused.Load() }

// Report records a supervisor report on sandbox id (the JSON of a
// compute.Report) and returns it. Reports of other generations are fenced:
// refused with FAILED_PRECONDITION, nothing recorded. A heartbeat appends
// nothing; it is taken when its generation's supervisor is the attached one.
func (s *Service) Report(ctx context.Context, id string, data []byte) (r compute.Report, err error) {
	defer func() {
		if err == nil || errors.Is(err, errEarly) {
			return
		}
		s.reportsRefused.Add(1)
		switch {
		case events.CodeOf(err) == events.CodeUnauthenticated:
			s.cfg.Metrics.Fenced(metrics.FencedCredential)
		case errors.Is(err, errFenced):
			s.cfg.Metrics.Fenced(metrics.FencedGeneration)
		}
	}()
	if r, err = s.verify(id, data); err != nil {
		return r, err
	}
	return r, s.report(ctx, id, r)
}

// verify decodes a supervisor report on sandbox id and checks that its
// credential is the one minted for the generation it claims.
func (s *Service) verify(id string, data []byte) (compute.Report, error) {
	var r compute.Report
	if err := decodeJSON(data, &r); err != nil {
		return r, err
	}
	if r.SandboxID != "" && r.SandboxID != id {
		return r, events.Errorf(events.CodeInvalidArgument, "report for %s sent on the subject of %s", r.SandboxID, id)
	}
	if err := ParseID(id); err != nil {
		return r, err
	}
	if s.creds == nil || !s.creds.Verify(id, r.Generation, r.Credential) {
		return r, events.Errorf(events.CodeUnauthenticated, "sandbox %s generation %d: bad supervisor credential", id, r.Generation)
	}
	return r, nil
}

func (s *Service) report(ctx context.Context, id string, r compute.Report) error {
	var e events.Event
	switch r.Kind {
	case compute.ReportHeartbeat:
		if err := s.attached(ctx, id, r.Generation); err != nil || !r.Active {
			return err
		}
		// The workload was busy: activity (README "Activity"), at most
		// once per window; the beat is taken whatever comes of it.
		if err := s.Active(ctx, id, events.ActiveSupervisor, fmt.Sprintf("supervisor:%d", r.Generation), s.now()); err != nil {
			s.log.Debug().Err(err).Str("sandbox_id", id).Msg("a busy workload's activity not recorded")
		}
		return nil
	case compute.ReportAttached:
		e = &events.SupervisorAttached{Generation: r.Generation}
	case compute.ReportDetached:
		e = &events.SupervisorDetached{Generation: r.Generation}
	case compute.ReportExited:
		e = &events.Exited{Generation: r.Generation, Code: r.ExitCode}
	default:
		return events.Errorf(events.CodeInvalidArgument, "unknown report kind %q", r.Kind)
	}
	actor := fmt.Sprintf("supervisor:%d", r.Generation)
	err := s.recordReport(ctx, id, actor, e)
	var te *TransitionError
	if errors.As(err, &te) {
		return events.Errorf(events.CodeFailedPrecondition, "sandbox %s: %v", id, err)
	}
	return err
}

// recordReport records a supervisor's attach, detach or exit e. One fact,
// one writer: the consumption of a retained state and the restore
// (sandbox.retained_state_consumed, sandbox.resumed) are the resume saga's
// to record, as the driver answered (sagas/resume.go; at a passed deadline,
// as the driver observed), and a supervisor records only what it saw
// itself. A report of a resumed generation that comes before the saga's
// record (awaits) waits for it here, woken by every state this instance
// caches and reading the subject's head at a growing interval (another
// instance may record it), for at most Config.ReportHold; then it is
// answered ABORTED, which is no final answer: the supervisor asks again
// (compute/supervisor.Final), so the report is taken once the saga's
// record is in the log, after it, or refused for good once the sandbox
// moved on (the resume failed, or its deadline passed).
func (s *Service) recordReport(ctx context.Context, id, actor string, e events.Event) error {
	gen := e.(report).SpeaksFor()
	var ready func() // the resume latency's ready stage, once recorded (latency.go)
	gate := func(sb *Sandbox) error {
		if why := awaits(sb, gen); why != "" {
			return early(events.Errorf(events.CodeAborted, "sandbox %s: %s; report it again", id, why))
		}
		ready = s.resumeReady(sb, e)
		return nil
	}
	hold := time.NewTimer(s.cfg.ReportHold)
	defer hold.Stop()
	poll := 2 * time.Millisecond
	for {
		err := s.record(ctx, events.Envelope{SandboxID: id}, actor, gate, e)
		if err == nil && ready != nil {
			ready()
		}
		if !errors.Is(err, errEarly) {
			return err
		}
		// Judged on the head, seq: woken by another sandbox's state, it
		// waits on without reading the log again.
		seq := s.cachedSeq(id)
		t := time.NewTimer(poll)
	wait:
		for {
			moved := s.movedCh()
			if s.cachedSeq(id) != seq {
				break
			}
			select {
			case <-moved:
			case <-t.C:
				poll = min(2*poll, 100*time.Millisecond)
				break wait
			case <-hold.C:
				t.Stop()
				return err
			case <-ctx.Done():
				t.Stop()
				return err
			}
		}
		t.Stop()
	}
}
