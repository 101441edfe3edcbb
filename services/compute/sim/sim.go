// Package sim is the simulated compute driver of CONTRACT §8: always
// available, with no real workload, its behaviour set per sandbox by the
// create request's driver_options. It exists for demos, tests and benchmarks,
// so every path of the lifecycle (rejections, hangs, failed restores, racing
// exits, supervisors that never attach) can be produced on demand.
//
// The driver keeps its state in memory, per sandbox, behind one mutex. With
// Config.Data it also writes every change to a journal there before it
// answers, and reads the journal back when it starts: a simulated workload
// outlives the service as a real one would, so a service killed and started
// again finds its sandboxes running, frozen or consumed as they were (a
// re-driven saga gets the answer the first call got, and a reference
// consumed before the kill is never restored again). The journal's effect
// records (start, stop, suspend, resume, discard, delete) are what Effects
// counts: each effect happens once per (sandbox, generation, operation),
// however often a call is repeated.
//
// Supervisor reports (attached, exited) go out through the Reporter from
// goroutines the driver owns, one per sandbox with reports pending, in the
// order they were produced for that sandbox: a driver call never waits for
// the bus, a generation's exit never overtakes its attach, and one sandbox's
// slow report never holds up another's. A workload that runs but whose attach
// was not taken yet when the driver starts is attached again (a supervisor
// retrying across a restart of the service). Close stops them and every timer.
//
// Restore references look like "sim:<sandbox>:<generation>:<random>".
package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync"
	"time"

	"github.com/torpor/torpor/services/compute"
)

var (
	_ compute.Driver    = (*Driver)(nil)
	_ compute.Suspender = (*Driver)(nil)
	_ compute.Observer  = (*Driver)(nil)
	_ compute.Logger    = (*Driver)(nil)
	_ compute.Dialer    = (*Driver)(nil)
)

// ErrClosed: the driver was closed.
var ErrClosed = errors.New("sim driver closed")

// Config says where the sim keeps what it knows.
type Config struct {
	// Data is the service's data directory: the journal lives in
	// <Data>/sim. Empty keeps everything in memory (lost with the process).
	Data string
}

// Driver is the sim driver. The zero value is not usable; call New.
type Driver struct {
	rep    compute.Reporter
	ctx    context.Context    // the report senders' context
	cancel context.CancelFunc // ends it
	quit   chan struct{}      // closed by Close
	once   sync.Once
	wg     sync.WaitGroup // report senders and armed timers

	mu     sync.Mutex
	closed bool
	jrn    *journal // nil in memory
	// queues holds each sandbox's reports not yet sent; a sandbox has a
	// sender goroutine exactly while it has an entry.
	queues map[string][]pending
	boxes  map[string]*box
	// calls counts the calls per operation (Calls).
	calls map[string]int
}

// box is what the sim knows of one sandbox: what the journal's records
// folded into, plus the timers of this process.
type box struct {
	gen      int64   // newest generation started or resumed
	running  bool    // the workload of gen runs
	cred     string  // credential of gen
	attached bool    // the attach of gen was taken
	exited   *int    // the exit code of gen, once it exited on its own
	o        options // the options of gen, parsed
	// suspends maps a suspended generation to the reference it produced.
	// The maps are nil until their first write.
	suspends map[int64]string
	// retained maps live references to the generation they retain.
	retained map[string]int64
	// consumed maps consumed references to the resume that consumed them;
	// last is the newest of them (Observe says it).
	consumed map[string]consumption
	last     string
	// attempts counts resume attempts per reference (fail_once).
	attempts map[string]int
	// lines is the simulated workload's output: a line per change.
	lines []string

	// exitGen is the generation whose exit_after timer is armed or fired;
	// attachTimer delays an attach (the attach option).
	exitGen     int64
	exitTimer   *time.Timer
	attachTimer *time.Timer
}

type consumption struct {
	gen    int64
	failed bool // fail_after_consume: consumed, yet the restore failed
}

// pending is one queued report; done, if set, receives the Reporter's answer.
type pending struct {
	r    compute.Report
	done chan error
}

// New returns a sim driver that sends supervisor reports through r, with
// the state its journal in cfg.Dir holds, if any.
func New(r compute.Reporter, cfg Config) (*Driver, error) {
	ctx, cancel := context.WithCancel(context.Background())
	d := &Driver{
		rep:    r,
		ctx:    ctx,
		cancel: cancel,
		quit:   make(chan struct{}),
		queues: map[string][]pending{},
		boxes:  map[string]*box{},
		calls:  map[string]int{},
	}
	if cfg.Data != "" {
		jrn, recs, err := openJournal(cfg.Data)
		if err != nil {
			cancel()
			return nil, err
		}
		for _, rec := range recs {
			d.applyLocked(rec)
		}
		d.jrn = jrn
		d.mu.Lock()
		for id, b := range d.boxes {
			if b.running && !b.attached {
				d.attachLocked(id, b) // its supervisor attaches again
			}
		}
		d.mu.Unlock()
	}
	return d, nil
}

// Calls returns how many times each operation (start, stop, suspend,
// resume, discard, delete, observe) was called, failed calls included.
func (d *Driver) Calls() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.calls)
}

// ReportsItself says the sim is its sandboxes' supervisor
// (compute.SelfReporting).
func (d *Driver) ReportsItself() bool { return true }

// Close stops the report loop and every timer and waits for them. Reports
// still queued are dropped. Calls after Close answer ErrClosed.
func (d *Driver) Close() {
	d.once.Do(func() {
		d.mu.Lock()
		d.closed = true
		for _, b := range d.boxes {
			d.disarmLocked(b)
		}
		clear(d.queues)
		d.mu.Unlock()
		close(d.quit)
		d.cancel()
	})
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.jrn != nil {
		_ = d.jrn.close()
		d.jrn = nil
	}
}

// Capabilities reports Suspend unless the options say suspend=unimplemented
// or are invalid.
func (d *Driver) Capabilities(opts map[string]string) compute.Capabilities {
	o, err := parse(opts)
	if err != nil {
		return compute.Capabilities{}
	}
	return compute.Capabilities{Suspend: o.suspend != SuspendUnimplemented, Retains: "a simulated workload, in the sim's journal"}
}

// Start runs generation req.Generation and queues its supervisor's attach
// report (after the attach option's delay). A repeated Start of the same
// generation queues the attach again and has no other effect; a Start of a
// generation older than the newest one seen does nothing.
func (d *Driver) Start(ctx context.Context, req compute.Start) error {
	id := req.Spec.SandboxID
	o, err := d.begin(ctx, "start", req.Spec)
	if err != nil {
		return fmt.Errorf("start %s generation %d: %w", id, req.Generation, err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("start %s: %w", id, ErrClosed)
	}
	b := d.boxes[id]
	switch {
	case b != nil && req.Generation < b.gen:
	case b != nil && req.Generation == b.gen:
		if b.running {
			d.attachLocked(id, b) // the supervisor answers the repeat
		}
	default:
		if err := d.commitLocked(record{Sandbox: id, Gen: req.Generation, Op: opStart, Cred: req.Credential, Opts: req.Spec.Options}); err != nil {
			d.mu.Unlock()
			return fmt.Errorf("start %s generation %d: %w", id, req.Generation, err)
		}
		d.attachLocked(id, d.boxes[id])
	}
	d.mu.Unlock()
	return d.answer(ctx, o)
}

// Stop ends the generation's workload. It is idempotent, and a Stop of
// another generation than the newest changes nothing.
func (d *Driver) Stop(ctx context.Context, t compute.Target) error {
	id := t.Spec.SandboxID
	o, err := d.begin(ctx, "stop", t.Spec)
	if err != nil {
		return fmt.Errorf("stop %s generation %d: %w", id, t.Generation, err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("stop %s: %w", id, ErrClosed)
	}
	if b := d.boxes[id]; b != nil && b.gen == t.Generation && b.running {
		if err := d.commitLocked(record{Sandbox: id, Gen: t.Generation, Op: opStop}); err != nil {
			d.mu.Unlock()
			return fmt.Errorf("stop %s generation %d: %w", id, t.Generation, err)
		}
	}
	d.mu.Unlock()
	return d.answer(ctx, o)
}

// Suspend answers as the suspend option says. On success the generation
// stops running and its state is retained behind a new reference; a repeated
// Suspend of the same generation returns the same reference. With
// exit_during_suspend the exit of the generation is reported before Suspend
// answers, and the reference is returned all the same.
func (d *Driver) Suspend(ctx context.Context, t compute.Target) (string, error) {
	id, gen := t.Spec.SandboxID, t.Generation
	o, err := d.begin(ctx, "suspend", t.Spec)
	if err != nil {
		return "", fmt.Errorf("suspend %s generation %d: %w", id, gen, err)
	}
	switch o.suspend {
	case SuspendUnimplemented:
		return "", fmt.Errorf("suspend %s: %w", id, compute.ErrUnimplemented)
	case SuspendReject:
		return "", fmt.Errorf("suspend %s generation %d: %w (suspend=reject)", id, gen, compute.ErrRejected)
	case SuspendHang:
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-d.quit:
			return "", fmt.Errorf("suspend %s: %w", id, ErrClosed)
		}
	}

	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return "", fmt.Errorf("suspend %s: %w", id, ErrClosed)
	}
	b := d.boxes[id]
	if b != nil {
		if ref, ok := b.suspends[gen]; ok {
			d.mu.Unlock()
			return ref, d.answer(ctx, o)
		}
	}
	if b == nil || gen != b.gen || !b.running {
		d.mu.Unlock()
		return "", fmt.Errorf("suspend %s generation %d: %w: the workload of that generation is not running", id, gen, compute.ErrRejected)
	}
	ref := fmt.Sprintf("sim:%s:%d:%s", id, gen, token())
	if err := d.commitLocked(record{Sandbox: id, Gen: gen, Op: opSuspend, Ref: ref}); err != nil {
		d.mu.Unlock()
		return "", fmt.Errorf("suspend %s generation %d: %w", id, gen, err)
	}
	var exited chan error
	if o.exitDuringSuspend != nil {
		// The workload exits while the suspension is in flight: its report
		// is out before the answer.
		code := *o.exitDuringSuspend
		if err := d.commitLocked(record{Sandbox: id, Gen: gen, Op: opExited, Code: &code}); err != nil {
			d.mu.Unlock()
			return "", fmt.Errorf("suspend %s generation %d: %w", id, gen, err)
		}
		exited = make(chan error, 1)
		d.enqueueLocked(pending{
			r:    compute.Report{SandboxID: id, Generation: gen, Credential: b.cred, Kind: compute.ReportExited, ExitCode: code},
			done: exited,
		})
	}
	d.mu.Unlock()

	if exited != nil {
		select {
		case <-exited:
		case <-ctx.Done():
			return "", ctx.Err()
		case <-d.quit:
			return "", fmt.Errorf("suspend %s: %w", id, ErrClosed)
		}
	}
	return ref, d.answer(ctx, o)
}

// Resume restores the retained state behind req.RestoreRef under
// req.Generation as the resume option says, and on success queues the attach
// report of that generation. A repeated Resume of the same (generation,
// reference) answers as the first one did.
func (d *Driver) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	id, gen := req.Spec.SandboxID, req.Generation
	o, err := d.begin(ctx, "resume", req.Spec)
	if err != nil {
		return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
	}
	if o.resume == ResumeHang {
		select {
		case <-ctx.Done():
			return compute.ResumeResult{}, ctx.Err()
		case <-d.quit:
			return compute.ResumeResult{}, fmt.Errorf("resume %s: %w", id, ErrClosed)
		}
	}
	res, err := d.resume(req, o)
	if aerr := d.answer(ctx, o); err == nil && aerr != nil {
		return res, aerr
	}
	return res, err
}

func (d *Driver) resume(req compute.Resume, o options) (compute.ResumeResult, error) {
	id, gen, ref := req.Spec.SandboxID, req.Generation, req.RestoreRef
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return compute.ResumeResult{}, fmt.Errorf("resume %s: %w", id, ErrClosed)
	}
	b := d.boxes[id]
	if b == nil {
		return compute.ResumeResult{}, fmt.Errorf("resume %s: %w: %q", id, compute.ErrUnknownRef, ref)
	}
	if c, ok := b.consumed[ref]; ok {
		switch {
		case c.gen != gen:
			return compute.ResumeResult{}, fmt.Errorf("resume %s: %w: %s was consumed by generation %d", id, compute.ErrUnknownRef, ref, c.gen)
		case c.failed:
			return compute.ResumeResult{Consumed: true}, fmt.Errorf("resume %s generation %d: restore failed after consuming %s (resume=fail_after_consume)", id, gen, ref)
		default:
			if b.running && b.gen == gen {
				d.attachLocked(id, b)
			}
			return compute.ResumeResult{Consumed: true}, nil
		}
	}
	if _, ok := b.retained[ref]; !ok {
		return compute.ResumeResult{}, fmt.Errorf("resume %s: %w: %q", id, compute.ErrUnknownRef, ref)
	}
	if err := d.commitLocked(record{Sandbox: id, Gen: gen, Op: opAttempt, Ref: ref}); err != nil {
		return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
	}
	switch {
	case o.resume == ResumeFail:
		return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: restore failed, %s kept (resume=fail)", id, gen, ref)
	case o.resume == ResumeFailOnce && b.attempts[ref] == 1:
		return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: restore failed, %s kept (resume=fail_once)", id, gen, ref)
	case o.resume == ResumeFailAfterConsume:
		if err := d.commitLocked(record{Sandbox: id, Gen: gen, Op: opResume, Ref: ref, Failed: true}); err != nil {
			return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
		}
		return compute.ResumeResult{Consumed: true}, fmt.Errorf("resume %s generation %d: restore failed after consuming %s (resume=fail_after_consume)", id, gen, ref)
	}
	if err := d.commitLocked(record{Sandbox: id, Gen: gen, Op: opResume, Ref: ref, Cred: req.Credential, Opts: req.Spec.Options}); err != nil {
		return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
	}
	d.attachLocked(id, b)
	return compute.ResumeResult{Consumed: true}, nil
}

// Discard forgets a retained state; it is idempotent.
func (d *Driver) Discard(ctx context.Context, spec compute.Spec, ref string) error {
	o, err := d.begin(ctx, "discard", spec)
	if err != nil {
		return fmt.Errorf("discard %s: %w", spec.SandboxID, err)
	}
	d.mu.Lock()
	if b := d.boxes[spec.SandboxID]; b != nil {
		if gen, held := b.retained[ref]; held {
			if err := d.commitLocked(record{Sandbox: spec.SandboxID, Gen: gen, Op: opDiscard, Ref: ref}); err != nil {
				d.mu.Unlock()
				return fmt.Errorf("discard %s: %w", spec.SandboxID, err)
			}
		}
	}
	d.mu.Unlock()
	return d.answer(ctx, o)
}

// Delete forgets everything of the sandbox, its retained states included;
// it is idempotent.
func (d *Driver) Delete(ctx context.Context, spec compute.Spec) error {
	o, err := d.begin(ctx, "delete", spec)
	if err != nil {
		return fmt.Errorf("delete %s: %w", spec.SandboxID, err)
	}
	d.mu.Lock()
	if b := d.boxes[spec.SandboxID]; b != nil {
		if err := d.commitLocked(record{Sandbox: spec.SandboxID, Gen: b.gen, Op: opDelete}); err != nil {
			d.mu.Unlock()
			return fmt.Errorf("delete %s: %w", spec.SandboxID, err)
		}
	}
	d.mu.Unlock()
	return d.answer(ctx, o)
}

// Observe says what is true of the sandbox now: its newest generation
// running, frozen behind a reference, stopped, exited with its code, or
// nothing known (gone), and the reference the newest resume consumed, with
// its generation; with observe=unknown, that it cannot tell.
func (d *Driver) Observe(ctx context.Context, spec compute.Spec) (compute.Observation, error) {
	d.mu.Lock()
	d.calls["observe"]++
	defer d.mu.Unlock()
	if o, err := parse(spec.Options); err != nil || o.observe == ObserveUnknown {
		return compute.Observation{}, fmt.Errorf("observe %s: %w: the sim cannot tell (observe=unknown)", spec.SandboxID, compute.ErrUnavailable)
	}
	if d.closed {
		return compute.Observation{}, fmt.Errorf("observe %s: %w", spec.SandboxID, ErrClosed)
	}
	b := d.boxes[spec.SandboxID]
	if b == nil {
		return compute.Observation{State: compute.StateGone}, nil
	}
	o := compute.Observation{State: compute.StateStopped, Generation: b.gen}
	if b.last != "" {
		o.Consumed, o.ConsumedGeneration = b.last, b.consumed[b.last].gen
	}
	switch {
	case b.exited != nil:
		o.State, o.ExitCode = compute.StateExited, *b.exited
	case b.running:
		o.State = compute.StateRunning
	default:
		if ref, ok := b.suspends[b.gen]; ok {
			if _, held := b.retained[ref]; held {
				o.State, o.RestoreRef, o.How = compute.StateFrozen, ref, "simulated"
			}
		}
	}
	return o, nil
}

// begin counts a call of op, parses the options and waits out the latency.
func (d *Driver) begin(ctx context.Context, op string, spec compute.Spec) (options, error) {
	d.mu.Lock()
	d.calls[op]++
	d.mu.Unlock()
	o, err := parse(spec.Options)
	if err != nil {
		return options{}, err
	}
	if err := d.wait(ctx, o.latency); err != nil {
		return options{}, err
	}
	return o, ctx.Err()
}

// answer waits out the answer_delay of a call whose effect is done.
func (d *Driver) answer(ctx context.Context, o options) error {
	return d.wait(ctx, o.answerDelay)
}

func (d *Driver) wait(ctx context.Context, dur time.Duration) error {
	if dur <= 0 {
		return nil
	}
	t := time.NewTimer(dur)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-d.quit:
		return ErrClosed
	}
}

// commitLocked writes rec to the journal, if there is one, and folds it
// into the sandbox's box; d.mu is held.
func (d *Driver) commitLocked(rec record) error {
	if d.jrn != nil {
		if err := d.jrn.write(rec); err != nil {
			return err
		}
	}
	d.applyLocked(rec)
	return nil
}

// applyLocked folds one record into the boxes: what the call that wrote it
// did, and what replaying the journal does again.
func (d *Driver) applyLocked(rec record) {
	id := rec.Sandbox
	if rec.Op == opDelete {
		if b := d.boxes[id]; b != nil {
			d.disarmLocked(b)
		}
		delete(d.boxes, id)
		return
	}
	b := d.boxes[id]
	if b == nil {
		// Its maps are made on their first write: most boxes (a fleet
		// adopted, or never suspended) never write them, and four empty
		// maps were most of an idle box's heap (issue 28's target).
		b = &box{}
		d.boxes[id] = b
	}
	b.say(rec)
	switch rec.Op {
	case opStart:
		d.runLocked(b, rec)
	case opStop:
		b.running = false
		d.disarmLocked(b)
	case opSuspend:
		if b.suspends == nil {
			b.suspends, b.retained = map[int64]string{}, map[string]int64{}
		}
		b.suspends[rec.Gen] = rec.Ref
		b.retained[rec.Ref] = rec.Gen
		b.running = false
		d.disarmLocked(b)
	case opAttempt:
		if b.attempts == nil {
			b.attempts = map[string]int{}
		}
		b.attempts[rec.Ref]++
	case opResume:
		delete(b.retained, rec.Ref)
		if b.consumed == nil {
			b.consumed = map[string]consumption{}
		}
		b.consumed[rec.Ref] = consumption{gen: rec.Gen, failed: rec.Failed}
		b.last = rec.Ref
		if !rec.Failed {
			d.runLocked(b, rec)
		}
	case opDiscard:
		delete(b.retained, rec.Ref)
	case opAttached:
		if b.gen == rec.Gen {
			b.attached = true
		}
	case opExited:
		if b.gen == rec.Gen {
			b.running, b.exited = false, rec.Code
		}
	}
}

// logLines bounds the output a box keeps.
const logLines = 1000

// say appends the line the simulated workload writes for rec.
func (b *box) say(rec record) {
	var line string
	switch rec.Op {
	case opStart:
		line = fmt.Sprintf("sim: generation %d started", rec.Gen)
	case opStop:
		line = fmt.Sprintf("sim: generation %d stopped", rec.Gen)
	case opSuspend:
		line = fmt.Sprintf("sim: generation %d suspended behind %s", rec.Gen, rec.Ref)
	case opAttempt:
		line = fmt.Sprintf("sim: a restore of %s for generation %d", rec.Ref, rec.Gen)
	case opResume:
		line = fmt.Sprintf("sim: generation %d restored from %s", rec.Gen, rec.Ref)
		if rec.Failed {
			line = fmt.Sprintf("sim: the restore of %s consumed it and failed", rec.Ref)
		}
	case opDiscard:
		line = fmt.Sprintf("sim: %s discarded", rec.Ref)
	case opAttached:
		line = fmt.Sprintf("sim: the supervisor of generation %d attached", rec.Gen)
	case opExited:
		line = fmt.Sprintf("sim: generation %d exited with code %d", rec.Gen, *rec.Code)
	default:
		return
	}
	b.lines = append(b.lines, line)
	if len(b.lines) > logLines {
		b.lines = b.lines[len(b.lines)-logLines:]
	}
}

// Logs returns the last tail lines of the simulated workload's output: a
// line per start, stop, suspension, restore and exit.
func (d *Driver) Logs(ctx context.Context, spec compute.Spec, tail int) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.boxes[spec.SandboxID]
	if b == nil {
		return nil, nil
	}
	lines := b.lines[max(0, len(b.lines)-tail):]
	var out []byte
	for _, l := range lines {
		out = append(append(out, l...), '\n')
	}
	return out, nil
}

// Dial connects to port of the simulated workload: the real address the
// ports option maps it to (connection refused for a port it does not map).
func (d *Driver) Dial(ctx context.Context, spec compute.Spec, port int) (net.Conn, error) {
	o, err := parse(spec.Options)
	if err != nil {
		return nil, err
	}
	addr, ok := o.ports[port]
	if !ok {
		return nil, fmt.Errorf("sim %s: nothing listens on port %d (no ports option maps it)", spec.SandboxID, port)
	}
	var dl net.Dialer
	return dl.DialContext(ctx, "tcp", addr)
}

// runLocked records that rec's generation now runs in b, with its options
// (a journal's options were valid when written: on an error it runs with
// none); d.mu is held.
func (d *Driver) runLocked(b *box, rec record) {
	d.disarmLocked(b)
	b.o, _ = parse(rec.Opts)
	b.gen, b.running, b.cred, b.attached, b.exited = rec.Gen, true, rec.Cred, false, nil
}

// attachLocked queues the attach of b's generation after the attach
// option's delay (never: not at all); d.mu is held.
func (d *Driver) attachLocked(id string, b *box) {
	o := b.o
	if o.attachNever || d.closed {
		return
	}
	r := compute.Report{SandboxID: id, Generation: b.gen, Credential: b.cred, Kind: compute.ReportAttached}
	if o.attach <= 0 {
		d.enqueueLocked(pending{r: r})
		return
	}
	if b.attachTimer != nil && b.attachTimer.Stop() {
		d.wg.Done()
	}
	d.wg.Add(1)
	b.attachTimer = time.AfterFunc(o.attach, func() {
		defer d.wg.Done()
		d.mu.Lock()
		defer d.mu.Unlock()
		if !d.closed && d.boxes[id] == b && b.gen == r.Generation && b.running {
			d.enqueueLocked(pending{r: r})
		}
	})
}

func (d *Driver) enqueueLocked(p pending) {
	id := p.r.SandboxID
	q, sending := d.queues[id]
	d.queues[id] = append(q, p)
	if !sending && !d.closed {
		d.wg.Add(1)
		go d.send(id)
	}
}

// send delivers sandbox id's queued reports in order and ends when its queue
// is empty. Once an attach is taken it records that, and arms the exit_after
// timer of that generation, so the exit follows the attach.
func (d *Driver) send(id string) {
	defer d.wg.Done()
	for {
		d.mu.Lock()
		q := d.queues[id]
		if len(q) == 0 || d.ctx.Err() != nil {
			delete(d.queues, id)
			d.mu.Unlock()
			return
		}
		p := q[0]
		d.queues[id] = q[1:]
		d.mu.Unlock()

		// A report the Reporter refuses is dropped, as a supervisor drops
		// one refused for good (serve's Reporter asks again on any other
		// answer).
		err := d.rep.Report(d.ctx, p.r)
		if p.done != nil {
			p.done <- err
		}
		if err == nil && p.r.Kind == compute.ReportAttached {
			d.attached(p.r.SandboxID, p.r.Generation)
		}
	}
}

// attached records that generation gen's attach was taken and arms its
// exit_after timer, once per generation, if the sandbox asks for one and
// gen still runs.
func (d *Driver) attached(id string, gen int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.boxes[id]
	if b == nil || b.gen != gen || !b.running {
		return
	}
	if !b.attached {
		// Taken is taken, closing or not (Close closes the journal after
		// the senders end). A journal that cannot be written only costs a
		// repeated attach after a restart.
		_ = d.commitLocked(record{Sandbox: id, Gen: gen, Op: opAttached})
	}
	if d.closed {
		return
	}
	o := b.o
	if o.exitAfter <= 0 || b.exitGen == gen {
		return
	}
	b.exitGen = gen
	code, cred := o.exitCode, b.cred
	d.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(o.exitAfter, func() {
		defer d.wg.Done()
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.closed || d.boxes[id] != b || b.exitTimer != t || b.gen != gen || !b.running {
			return
		}
		b.exitTimer = nil
		if err := d.commitLocked(record{Sandbox: id, Gen: gen, Op: opExited, Code: &code}); err != nil {
			return
		}
		d.enqueueLocked(pending{r: compute.Report{SandboxID: id, Generation: gen, Credential: cred, Kind: compute.ReportExited, ExitCode: code}})
	})
	b.exitTimer = t
}

// disarmLocked stops the timers of b that have not fired.
func (d *Driver) disarmLocked(b *box) {
	if b.exitTimer != nil && b.exitTimer.Stop() {
		d.wg.Done()
	}
	b.exitTimer = nil
	if b.attachTimer != nil && b.attachTimer.Stop() {
		d.wg.Done()
	}
	b.attachTimer = nil
}

// token is a short random string that makes references unguessable.
func token() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
