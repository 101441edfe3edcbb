package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natstest"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/drivertest"
	"github.com/torpor/torpor/services/compute/remote"
	"github.com/torpor/torpor/services/compute/sim"
)

// wait bounds every wait of these tests.
const wait = 10 * time.Second

// recorder is a Reporter that hands every report to a channel.
type recorder struct{ ch chan compute.Report }

func newRecorder() *recorder { return &recorder{ch: make(chan compute.Report, 256)} }

func (r *recorder) Report(ctx context.Context, rep compute.Report) error {
	select {
	case r.ch <- rep:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// serve serves drivers as node on nc until the test's cleanup.
func serve(t *testing.T, nc *nats.Conn, node string, drivers compute.Registry) *remote.Server {
	t.Helper()
	s, err := remote.Serve(context.Background(), nc, node, drivers, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return s
}

// newSim is a sim driver reporting to a recorder, closed at cleanup.
func newSim(t *testing.T) (*sim.Driver, *recorder) {
	t.Helper()
	rec := newRecorder()
	d, err := sim.New(rec, sim.Config{Data: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, rec
}

// attached waits for the next report, an attach.
func attached(t *testing.T, rec *recorder) {
	t.Helper()
	select {
	case r := <-rec.ch:
		if r.Kind != compute.ReportAttached {
			t.Fatalf("report %+v, want an attach", r)
		}
	case <-time.After(wait):
		t.Fatal("no attach")
	}
}

// connect is a new connection to url, closed at cleanup.
func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

func spec(id string, opts map[string]string) compute.Spec {
	return compute.Spec{SandboxID: id, Node: "n1", Options: opts}
}

// TestRemoteContractSim runs the driver contract suite against the sim
// behind the bus: a Client on one connection, Serve on another.
func TestRemoteContractSim(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Harness {
		d, rec := newSim(t)
		srv := natstest.Start(t)
		serve(t, srv.Connect(t), "n1", compute.Registry{"sim": d})
		return drivertest.Harness{
			Driver:  remote.NewClient(srv.Conn, "n1", "sim"),
			Reports: rec.ch,
			Spec:    func(id string) compute.Spec { return spec(id, nil) },
		}
	})
}

// fake is a driver of hand-written answers, and no Suspender: a nil
// function answers nil.
type fake struct {
	start   func(ctx context.Context, req compute.Start) error
	observe func(ctx context.Context, spec compute.Spec) (compute.Observation, error)
	logs    func(ctx context.Context, spec compute.Spec, tail int) ([]byte, error)
}

var (
	_ compute.Observer = (*fake)(nil)
	_ compute.Logger   = (*fake)(nil)
)

// Capabilities claims suspensions the fake cannot do: the server must not
// believe it.
func (f *fake) Capabilities(map[string]string) compute.Capabilities {
	return compute.Capabilities{Suspend: true, Retains: "nothing, it claims"}
}

func (f *fake) Start(ctx context.Context, req compute.Start) error {
	if f.start == nil {
		return nil
	}
	return f.start(ctx, req)
}

func (f *fake) Stop(context.Context, compute.Target) error { return nil }
func (f *fake) Delete(context.Context, compute.Spec) error { return nil }

func (f *fake) Observe(ctx context.Context, spec compute.Spec) (compute.Observation, error) {
	if f.observe == nil {
		return compute.Observation{State: compute.StateGone}, nil
	}
	return f.observe(ctx, spec)
}

func (f *fake) Logs(ctx context.Context, spec compute.Spec, tail int) ([]byte, error) {
	if f.logs == nil {
		return nil, nil
	}
	return f.logs(ctx, spec, tail)
}

// raw sends body to subject and returns the reply's body, decoded, and its
// headers.
func raw(t *testing.T, nc *nats.Conn, subject, body string) (remote.Reply, nats.Header) {
	t.Helper()
	msg, err := nc.Request(subject, []byte(body), wait)
	if err != nil {
		t.Fatalf("request %s: %v", subject, err)
	}
	var rep remote.Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		t.Fatalf("reply to %s is no reply: %q", subject, msg.Data)
	}
	return rep, msg.Header
}

// TestRemoteBadInputOnTheWire: what the server answers requests it cannot
// serve, as a client of any language sees it.
func TestRemoteBadInputOnTheWire(t *testing.T) {
	d, _ := newSim(t)
	srv := natstest.Start(t)
	serve(t, srv.Connect(t), "n1", compute.Registry{"sim": d})
	okSpec := `"spec":{"sandbox_id":"sb1","node":"n1"}`
	for _, tc := range []struct {
		name, subject, body string
		code                events.Code
		kind                string
	}{
		{"an unknown operation", "torpor.driver.n1.frobnicate", `{"driver":"sim",` + okSpec + `}`, events.CodeUnimplemented, remote.KindUnimplemented},
		{"an operation with a tail of tokens", "torpor.driver.n1.start.now", `{"driver":"sim"}`, events.CodeUnimplemented, remote.KindUnimplemented},
		{"malformed JSON", "torpor.driver.n1.observe", `{"driver":`, events.CodeInvalidArgument, ""},
		{"JSON that is no object", "torpor.driver.n1.observe", `["sim"]`, events.CodeInvalidArgument, ""},
		{"an empty body", "torpor.driver.n1.observe", ``, events.CodeInvalidArgument, ""},
		{"JSON null", "torpor.driver.n1.observe", `null`, events.CodeInvalidArgument, ""},
		{"a field of the wrong type", "torpor.driver.n1.logs", `{"driver":"sim",` + okSpec + `,"tail":"ten"}`, events.CodeInvalidArgument, ""},
		{"no driver named", "torpor.driver.n1.observe", `{` + okSpec + `}`, events.CodeInvalidArgument, ""},
		{"an unknown driver", "torpor.driver.n1.observe", `{"driver":"nope",` + okSpec + `}`, events.CodeNotFound, ""},
		{"a start without its argument", "torpor.driver.n1.start", `{"driver":"sim",` + okSpec + `}`, events.CodeInvalidArgument, ""},
		{"a stop without its argument", "torpor.driver.n1.stop", `{"driver":"sim"}`, events.CodeInvalidArgument, ""},
		{"a resume without its argument", "torpor.driver.n1.resume", `{"driver":"sim"}`, events.CodeInvalidArgument, ""},
		{"an observe without a spec", "torpor.driver.n1.observe", `{"driver":"sim"}`, events.CodeInvalidArgument, ""},
		{"a negative timeout", "torpor.driver.n1.observe", `{"driver":"sim",` + okSpec + `,"timeout_ms":-1}`, events.CodeInvalidArgument, ""},
		{"an export the sim cannot do", "torpor.driver.n1.export", `{"driver":"sim",` + okSpec + `,"ref":"r"}`, events.CodeUnimplemented, remote.KindUnimplemented},
		{"a resume of a reference never made", "torpor.driver.n1.resume", `{"driver":"sim","resume":{` + okSpec + `,"generation":2,"restore_ref":"never"}}`, events.CodeFailedPrecondition, remote.KindUnknownRef},
		// Only the owning node acts on a sandbox.
		{"a start of another node's sandbox", "torpor.driver.n1.start", `{"driver":"sim","start":{"spec":{"sandbox_id":"sb2","node":"n2"},"generation":1,"credential":"c"}}`, events.CodeFailedPrecondition, ""},
		{"a discard of another node's sandbox", "torpor.driver.n1.discard", `{"driver":"sim","spec":{"sandbox_id":"sb2","node":"n2"},"ref":"r"}`, events.CodeFailedPrecondition, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, hdr := raw(t, srv.Conn, tc.subject, tc.body)
			if rep.Error == nil || rep.Error.Code != tc.code || rep.Error.Kind != tc.kind || rep.Error.Message == "" {
				t.Fatalf("reply %+v (error %+v), want code %s kind %q", rep, rep.Error, tc.code, tc.kind)
			}
			if hdr.Get(micro.ErrorHeader) == "" || hdr.Get(micro.ErrorCodeHeader) == "" {
				t.Fatalf("an error reply without micro's error headers: %v", hdr)
			}
		})
	}
	t.Run("the start meant for another node did nothing", func(t *testing.T) {
		rep, _ := raw(t, srv.Conn, "torpor.driver.n1.observe", `{"driver":"sim","spec":{"sandbox_id":"sb2","node":"n1"}}`)
		if rep.Error != nil || rep.Observation == nil || rep.Observation.State != compute.StateGone {
			t.Fatalf("reply %+v (error %+v), want an observation of nothing", rep, rep.Error)
		}
	})
	t.Run("unknown fields are ignored", func(t *testing.T) {
		rep, _ := raw(t, srv.Conn, "torpor.driver.n1.observe", `{"driver":"sim",`+okSpec+`,"added_later":true}`)
		if rep.Error != nil || rep.Observation == nil || rep.Observation.State != compute.StateGone {
			t.Fatalf("reply %+v (error %+v), want an observation of nothing", rep, rep.Error)
		}
	})
}

// TestRemoteErrorsSurviveTheBus: a Client's errors wrap the sentinel the
// driver's did and carry its code, and the sentinels that share a code are
// told apart.
func TestRemoteErrorsSurviveTheBus(t *testing.T) {
	d, rec := newSim(t)
	srv := natstest.Start(t)
	f := &fake{start: func(context.Context, compute.Start) error {
		return events.Errorf(events.CodeAborted, "told to abort")
	}}
	serve(t, srv.Connect(t), "n1", compute.Registry{"sim": d, "fake": f})
	c := remote.NewClient(srv.Conn, "n1", "sim")

	res, err := c.Resume(ctx(t), compute.Resume{Spec: spec("sb1", nil), Generation: 2, RestoreRef: "never-made"})
	if !errors.Is(err, compute.ErrUnknownRef) || errors.Is(err, compute.ErrRejected) || events.CodeOf(err) != events.CodeFailedPrecondition || res.Consumed {
		t.Fatalf("resume of a reference never made: %+v, %v (%s); want ErrUnknownRef alone, FAILED_PRECONDITION", res, err, events.CodeOf(err))
	}

	rejecting := spec("sb2", map[string]string{sim.OptSuspend: sim.SuspendReject})
	if err := c.Start(ctx(t), compute.Start{Spec: rejecting, Generation: 1, Credential: "c"}); err != nil {
		t.Fatal(err)
	}
	attached(t, rec)
	_, err = c.Suspend(ctx(t), compute.Target{Spec: rejecting, Generation: 1})
	if !errors.Is(err, compute.ErrRejected) || errors.Is(err, compute.ErrUnknownRef) || events.CodeOf(err) != events.CodeFailedPrecondition {
		t.Fatalf("a rejected suspend: %v (%s); want ErrRejected alone, FAILED_PRECONDITION", err, events.CodeOf(err))
	}
	if !strings.Contains(err.Error(), "sb2") {
		t.Fatalf("the message %q lost the driver's words", err)
	}

	// A resume that fails after consuming says so with its error.
	failing := spec("sb3", map[string]string{sim.OptResume: sim.ResumeFailAfterConsume})
	if err := c.Start(ctx(t), compute.Start{Spec: failing, Generation: 1, Credential: "c"}); err != nil {
		t.Fatal(err)
	}
	attached(t, rec)
	ref, err := c.Suspend(ctx(t), compute.Target{Spec: failing, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, err = c.Resume(ctx(t), compute.Resume{Spec: failing, Generation: 2, Credential: "c2", RestoreRef: ref})
	if err == nil || !res.Consumed {
		t.Fatalf("a resume failing after it consumed: %+v, %v; want consumed and an error", res, err)
	}

	// An error with a code of its own and no sentinel keeps the code.
	err = remote.NewClient(srv.Conn, "n1", "fake").Start(ctx(t), compute.Start{Spec: spec("sb4", nil), Generation: 1})
	if events.CodeOf(err) != events.CodeAborted || errors.Is(err, compute.ErrRejected) || err.Error() != "told to abort" {
		t.Fatalf("start: %v (%s), want ABORTED as the driver said", err, events.CodeOf(err))
	}

	// An unknown driver is NOT_FOUND, and says nothing of any resource.
	_, err = remote.NewClient(srv.Conn, "n1", "nope").Observe(ctx(t), spec("sb5", nil))
	if events.CodeOf(err) != events.CodeNotFound || errors.Is(err, compute.ErrResourceMissing) {
		t.Fatalf("observe of an unknown driver: %v (%s), want NOT_FOUND without ErrResourceMissing", err, events.CodeOf(err))
	}

	logs, err := c.Logs(ctx(t), failing, 100)
	if err != nil || !strings.Contains(string(logs), "\n") {
		t.Fatalf("logs: %q, %v", logs, err)
	}
}

// TestRemoteDriverWithoutOptionalInterfaces: a driver that is no
// Suspender (nor Exporter, nor SpecValidator) behind the bus answers
// UNIMPLEMENTED for what it lacks, however able the Client is, and its
// capabilities say it cannot suspend whatever it claims.
func TestRemoteDriverWithoutOptionalInterfaces(t *testing.T) {
	srv := natstest.Start(t)
	serve(t, srv.Connect(t), "n1", compute.Registry{"fake": &fake{}})
	c := remote.NewClient(srv.Conn, "n1", "fake")
	s := spec("sb1", nil)
	unimplemented := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, compute.ErrUnimplemented) || events.CodeOf(err) != events.CodeUnimplemented {
			t.Errorf("%s: %v (%s), want ErrUnimplemented, UNIMPLEMENTED", what, err, events.CodeOf(err))
		}
	}
	_, err := c.Suspend(ctx(t), compute.Target{Spec: s, Generation: 1})
	unimplemented("suspend", err)
	res, err := c.Resume(ctx(t), compute.Resume{Spec: s, Generation: 2, RestoreRef: "r"})
	unimplemented("resume", err)
	if res.Consumed {
		t.Error("a resume the driver cannot do consumed")
	}
	unimplemented("discard", c.Discard(ctx(t), s, "r"))
	_, err = c.Export(ctx(t), s, "r")
	unimplemented("export", err)
	_, err = c.Dial(ctx(t), s, 80)
	unimplemented("dial", err)
	if caps := c.Capabilities(nil); caps.Suspend || caps.Retains != "" {
		t.Errorf("capabilities %+v of a driver that is no Suspender", caps)
	}
	if err := c.ValidateSpec(s); err != nil {
		t.Errorf("validate by a driver that checks nothing: %v", err)
	}
	if o, err := c.Observe(ctx(t), s); err != nil || o.State != compute.StateGone {
		t.Errorf("observe: %+v, %v", o, err)
	}
}

// TestRemoteUnservedNode: a node nobody serves is ErrUnavailable at once
// (no responders), not after the timeout, and ErrNotDelivered: the call
// provably reached no node; so is a server that stopped, and Capabilities
// are then none.
func TestRemoteUnservedNode(t *testing.T) {
	srv := natstest.Start(t)
	c := remote.NewClient(srv.Conn, "n2", "sim")
	began := time.Now()
	err := c.Start(ctx(t), compute.Start{Spec: spec("sb1", nil), Generation: 1})
	if !errors.Is(err, compute.ErrUnavailable) || events.CodeOf(err) != events.CodeUnavailable || !errors.Is(err, nats.ErrNoResponders) ||
		!errors.Is(err, compute.ErrNotDelivered) {
		t.Fatalf("start on a node nobody serves: %v (%s), want ErrUnavailable, ErrNotDelivered", err, events.CodeOf(err))
	}
	if took := time.Since(began); took > remote.LongTimeout/2 {
		t.Fatalf("no responders took %s", took)
	}
	if caps := c.Capabilities(nil); caps != (compute.Capabilities{}) {
		t.Fatalf("capabilities %+v without an answer", caps)
	}

	d, _ := newSim(t)
	s := serve(t, srv.Connect(t), "n2", compute.Registry{"sim": d})
	if caps := c.Capabilities(nil); !caps.Suspend {
		t.Fatalf("capabilities %+v of the sim", caps)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Observe(ctx(t), spec("sb1", nil)); !errors.Is(err, compute.ErrUnavailable) || !errors.Is(err, compute.ErrNotDelivered) {
		t.Fatalf("observe after the stop: %v, want ErrUnavailable, ErrNotDelivered", err)
	}
	if _, err := remote.NewClient(srv.Conn, "n.2", "sim").Observe(ctx(t), spec("sb1", nil)); events.CodeOf(err) != events.CodeInvalidArgument {
		t.Fatalf("a node with a dot: %v, want INVALID_ARGUMENT", err)
	}
}

// TestRemoteCallsRunConcurrently: a start that waits for another
// sandbox's start to arrive at the driver is not held up by it: calls are
// not served one after the other.
func TestRemoteCallsRunConcurrently(t *testing.T) {
	srv := natstest.Start(t)
	aArrived, bArrived := make(chan struct{}), make(chan struct{})
	f := &fake{start: func(ctx context.Context, req compute.Start) error {
		if req.Spec.SandboxID == "b" {
			close(bArrived)
			return nil
		}
		close(aArrived)
		select {
		case <-bArrived:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	serve(t, srv.Connect(t), "n1", compute.Registry{"fake": f})
	c := remote.NewClient(srv.Conn, "n1", "fake")
	errs := make(chan error, 1)
	go func() { errs <- c.Start(ctx(t), compute.Start{Spec: spec("a", nil), Generation: 1}) }()
	<-aArrived
	if err := c.Start(ctx(t), compute.Start{Spec: spec("b", nil), Generation: 1}); err != nil {
		t.Fatalf("start of b while a's is under way: %v", err)
	}
	if err := <-errs; err != nil {
		t.Fatalf("start of a: %v", err)
	}
}

// TestRemoteCallTimeouts: the client's wait bounds the driver call on the
// server too, and a call ended by its timeout is UNAVAILABLE (its effect
// unknown: never ErrNotDelivered), never a refusal; one whose time was up
// before it was sent is ErrNotDelivered.
func TestRemoteCallTimeouts(t *testing.T) {
	srv := natstest.Start(t)
	ended := make(chan time.Duration, 4)
	f := &fake{start: func(ctx context.Context, req compute.Start) error {
		began := time.Now()
		<-ctx.Done()
		ended <- time.Since(began)
		return ctx.Err()
	}}
	serve(t, srv.Connect(t), "n1", compute.Registry{"fake": f})

	c := remote.NewClient(srv.Conn, "n1", "fake", remote.WithOpTimeout(remote.OpStart, 200*time.Millisecond))
	err := c.Start(ctx(t), compute.Start{Spec: spec("a", nil), Generation: 1})
	if !errors.Is(err, compute.ErrUnavailable) || errors.Is(err, compute.ErrNotDelivered) {
		t.Fatalf("a start past its timeout: %v, want ErrUnavailable, not ErrNotDelivered (the driver got it)", err)
	}
	select {
	case took := <-ended:
		if took > wait/2 {
			t.Fatalf("the driver call ran %s", took)
		}
	case <-time.After(wait):
		t.Fatal("the driver call did not end with the client's wait")
	}

	// The request's timeout alone bounds the call: the server answers.
	rep, _ := raw(t, srv.Conn, remote.Subject("n1", remote.OpStart), `{"driver":"fake","timeout_ms":100,"start":{"spec":{"sandbox_id":"b"},"generation":1}}`)
	if rep.Error == nil || rep.Error.Code != events.CodeUnavailable || rep.Error.Kind != remote.KindUnavailable {
		t.Fatalf("reply %+v, want UNAVAILABLE", rep.Error)
	}
	<-ended

	// A context's deadline shortens the wait (and the server's bound: its
	// answer may come first).
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := remote.NewClient(srv.Conn, "n1", "fake").Start(short, compute.Start{Spec: spec("c", nil), Generation: 1}); !errors.Is(err, compute.ErrUnavailable) {
		t.Fatalf("a start past its context's deadline: %v", err)
	}
	<-ended

	// A context already ended: the call is never sent. (short may not
	// have ended yet: the server's answer can come before its deadline.)
	ended2, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	err = remote.NewClient(srv.Conn, "n1", "fake").Start(ended2, compute.Start{Spec: spec("d", nil), Generation: 1})
	if !errors.Is(err, compute.ErrNotDelivered) {
		t.Fatalf("a start whose context ended before it was sent: %v, want ErrNotDelivered", err)
	}
}

// TestRemoteStopEndsCalls: ending Serve's context stops the server and
// ends the calls under way, which answer UNAVAILABLE; the node is then
// unserved.
func TestRemoteStopEndsCalls(t *testing.T) {
	srv := natstest.Start(t)
	arrived := make(chan struct{})
	f := &fake{start: func(ctx context.Context, req compute.Start) error {
		close(arrived)
		<-ctx.Done()
		return ctx.Err()
	}}
	sctx, cancel := context.WithCancel(context.Background())
	s, err := remote.Serve(sctx, srv.Connect(t), "n1", compute.Registry{"fake": f}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	c := remote.NewClient(srv.Conn, "n1", "fake")
	errs := make(chan error, 1)
	go func() { errs <- c.Start(ctx(t), compute.Start{Spec: spec("a", nil), Generation: 1}) }()
	<-arrived
	cancel()
	if err := <-errs; !errors.Is(err, compute.ErrUnavailable) || !strings.Contains(err.Error(), "stop") {
		t.Fatalf("a start under way at the stop: %v, want ErrUnavailable", err)
	}
	select {
	case <-s.Done():
	case <-time.After(wait):
		t.Fatal("the server did not stop with its context")
	}
	if _, err := c.Observe(ctx(t), spec("a", nil)); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("observe after the stop: %v, want no responders", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRemoteOneAnswerPerRequest: two processes serving one node share the
// requests (a queue group), and each request gets exactly one answer, the
// catch-all of unknown operations staying silent for known ones.
func TestRemoteOneAnswerPerRequest(t *testing.T) {
	srv := natstest.Start(t)
	var calls [2]atomic.Int64
	for i := range calls {
		serve(t, srv.Connect(t), "n1", compute.Registry{"fake": &fake{observe: func(context.Context, compute.Spec) (compute.Observation, error) {
			calls[i].Add(1)
			return compute.Observation{State: compute.StateGone}, nil
		}}})
	}
	inbox := nats.NewInbox()
	sub, err := srv.Conn.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := 0; i < n; i++ {
		if err := srv.Conn.PublishRequest(remote.Subject("n1", remote.OpObserve), inbox, []byte(`{"driver":"fake","spec":{"sandbox_id":"a"}}`)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		if _, err := sub.NextMsg(wait); err != nil {
			t.Fatalf("answer %d: %v", i+1, err)
		}
	}
	// An unknown operation last: the catch-all answers it after whatever
	// it might have answered of the known ones, on the same connection.
	if err := srv.Conn.PublishRequest("torpor.driver.n1.frobnicate", inbox, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	var rep remote.Reply
	for rep.Error == nil || rep.Error.Code != events.CodeUnimplemented {
		m, err := sub.NextMsg(wait)
		if err != nil {
			t.Fatalf("no UNIMPLEMENTED answer: %v", err)
		}
		rep = remote.Reply{}
		if err := json.Unmarshal(m.Data, &rep); err != nil || rep.Error == nil {
			t.Fatalf("a second answer to a known operation: %q", m.Data)
		}
	}
	if got := calls[0].Load() + calls[1].Load(); got != n {
		t.Fatalf("%d driver calls for %d requests", got, n)
	}
	if pending, _, _ := sub.Pending(); pending != 0 {
		t.Fatalf("%d answers more", pending)
	}
}

// TestRemoteMicroService: `nats micro ls` finds the drivers of a node, an
// endpoint per operation.
func TestRemoteMicroService(t *testing.T) {
	srv := natstest.Start(t)
	d, _ := newSim(t)
	serve(t, srv.Connect(t), "n1", compute.Registry{"sim": d})
	msg, err := srv.Conn.Request("$SRV.INFO."+remote.ServiceName, nil, wait)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != remote.ServiceName || info.Metadata["node"] != "n1" || info.Metadata["drivers"] != "sim" {
		t.Fatalf("info %+v", info)
	}
	got := map[string]string{}
	for _, e := range info.Endpoints {
		got[e.Name] = e.Subject
		if e.QueueGroup != remote.QueueGroup {
			t.Errorf("endpoint %s in queue group %q", e.Name, e.QueueGroup)
		}
	}
	for _, op := range remote.Ops {
		if got[op] != "torpor.driver.n1."+op {
			t.Errorf("endpoint %s: subject %q", op, got[op])
		}
	}
	if len(got) != len(remote.Ops) {
		t.Errorf("endpoints %v", got)
	}
}

// TestRemoteOversizedAnswer: an answer the bus cannot carry is
// RESOURCE_EXHAUSTED, not a silence the client waits out.
func TestRemoteOversizedAnswer(t *testing.T) {
	srv := natstest.Start(t)
	f := &fake{logs: func(context.Context, compute.Spec, int) ([]byte, error) {
		return []byte(strings.Repeat("a line of output\n", int(srv.Conn.MaxPayload())/16)), nil
	}}
	serve(t, srv.Connect(t), "n1", compute.Registry{"fake": f})
	_, err := remote.NewClient(srv.Conn, "n1", "fake").Logs(ctx(t), spec("a", nil), 0)
	if events.CodeOf(err) != events.CodeResourceExhausted {
		t.Fatalf("logs larger than the max payload: %v (%s)", err, events.CodeOf(err))
	}
}

// TestRemoteServeRefuses: a node that is no subject token, or nothing to
// serve.
func TestRemoteServeRefuses(t *testing.T) {
	srv := natstest.Start(t)
	d, _ := newSim(t)
	for _, node := range []string{"", "n.1", "n*", ">"} {
		if _, err := remote.Serve(context.Background(), srv.Conn, node, compute.Registry{"sim": d}, zerolog.Nop()); events.CodeOf(err) != events.CodeInvalidArgument {
			t.Errorf("node %q: %v, want INVALID_ARGUMENT", node, err)
		}
	}
	if _, err := remote.Serve(context.Background(), srv.Conn, "n1", nil, zerolog.Nop()); events.CodeOf(err) != events.CodeInvalidArgument {
		t.Errorf("no drivers: %v, want INVALID_ARGUMENT", err)
	}
}

// TestRemoteStopWaitsForCalls: Stop returns after the calls under way,
// which answer as they would have.
func TestRemoteStopWaitsForCalls(t *testing.T) {
	srv := natstest.Start(t)
	arrived, release := make(chan struct{}), make(chan struct{})
	f := &fake{start: func(ctx context.Context, req compute.Start) error {
		close(arrived)
		<-release
		return nil
	}}
	s, err := remote.Serve(context.Background(), srv.Connect(t), "n1", compute.Registry{"fake": f}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() {
		started <- remote.NewClient(srv.Conn, "n1", "fake").Start(ctx(t), compute.Start{Spec: spec("a", nil), Generation: 1})
	}()
	<-arrived
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop() }()
	// What is checked is an absence: Stop must not return while the call
	// is held, so give it the time a Stop that does not wait would take.
	select {
	case <-stopped:
		t.Fatal("Stop returned while a call was under way")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatalf("the start under way at the stop: %v", err)
	}
}

// TestRemoteOnlyFrom: a server told to serve the service's requests only
// refuses, PERMISSION_DENIED, one answered on another inbox (a push
// consumer's delivery another driver aimed at this node, on a bus with
// accounts), and serves the service's; before, it served both.
func TestRemoteOnlyFrom(t *testing.T) {
	srv := natstest.Start(t)
	started := 0
	f := &fake{start: func(context.Context, compute.Start) error { started++; return nil }}
	s, err := remote.Serve(context.Background(), srv.Connect(t), "n1", compute.Registry{"fake": f}, zerolog.Nop(), remote.OnlyFrom("_SVC"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	body := `{"driver":"fake","start":{"spec":{"sandbox_id":"a"},"generation":1}}`
	if rep, _ := raw(t, srv.Conn, remote.Subject("n1", remote.OpStart), body); rep.Error == nil || rep.Error.Code != events.CodePermissionDenied {
		t.Errorf("a request answered on _INBOX: %+v, want PERMISSION_DENIED", rep.Error)
	}
	svc, err := nats.Connect("", nats.InProcessServer(srv.Server), nats.CustomInboxPrefix("_SVC"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	if rep, _ := raw(t, svc, remote.Subject("n1", remote.OpStart), body); rep.Error != nil {
		t.Errorf("the service's request: %+v", rep.Error)
	}
	if started != 1 {
		t.Errorf("the driver started %d times, want once (the service's)", started)
	}
}

// TestRemoteCheckLostIsShort: a check whose request gets no answer (lost
// with a server of the cluster, here a node that never answers) is
// UNAVAILABLE after the short timeout, so that the resume saga asks again
// within its deadline instead of waiting the whole of it on one request.
func TestRemoteCheckLostIsShort(t *testing.T) {
	srv := natstest.Start(t)
	sub, err := srv.Conn.QueueSubscribe(remote.Subject("n1", remote.OpCheck), remote.QueueGroup, func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	c := remote.NewClient(srv.Conn, "n1", "fake")
	cctx, cancel := context.WithTimeout(context.Background(), remote.LongTimeout)
	defer cancel()
	began := time.Now()
	err = c.CanRestore(cctx, spec("a", nil), "r")
	took := time.Since(began)
	if !errors.Is(err, compute.ErrUnavailable) {
		t.Fatalf("a check never answered: %v, want ErrUnavailable", err)
	}
	if took > remote.ShortTimeout+remote.ShortTimeout/2 {
		t.Fatalf("a check never answered took %s, want about the short timeout %s", took, remote.ShortTimeout)
	}
}
