// Package sim is the simulated compute driver of CONTRACT §8: always
// available, with no real workload, its behaviour set per sandbox by the
// create request's driver_options. It exists for demos, tests and benchmarks,
// so every path of the lifecycle (rejections, hangs, failed restores, racing
// exits) can be produced on demand.
//
// The driver keeps its state in memory, per sandbox, behind one mutex. Its
// effects are idempotent per (sandbox, generation, operation). Supervisor
// reports (attached, exited) go out through the Reporter from goroutines the
// driver owns, one per sandbox with reports pending, in the order they were
// produced for that sandbox: a driver call never waits for the bus, a
// generation's exit never overtakes its attach, and one sandbox's slow report
// never holds up another's. Close stops them and every timer.
//
// Restore references look like "sim:<sandbox>:<generation>:<random>". Because
// the service may restart while the sim's memory is lost, a reference the
// driver never saw but which has the "sim:" prefix and names the sandbox is
// treated as restorable: within one process the sim keeps a retained state
// until it is consumed, discarded or its sandbox deleted, and it remembers
// those so they are never restored again.
package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/torpor/torpor/services/compute"
)

var _ compute.Driver = (*Driver)(nil)

// ErrClosed: the driver was closed.
var ErrClosed = errors.New("sim driver closed")

// Driver is the sim driver. The zero value is not usable; call New.
type Driver struct {
	rep    compute.Reporter
	ctx    context.Context    // the report senders' context
	cancel context.CancelFunc // ends it
	quit   chan struct{}      // closed by Close
	once   sync.Once
	wg     sync.WaitGroup // report senders and armed exit timers

	mu     sync.Mutex
	closed bool
	// queues holds each sandbox's reports not yet sent; a sandbox has a
	// sender goroutine exactly while it has an entry.
	queues map[string][]pending
	boxes  map[string]*box
	// dead holds references that were consumed elsewhere, discarded or
	// invalidated by a delete, so that the lenient rule for unknown
	// references never revives them.
	dead map[string]bool
	// calls counts the calls per operation (Calls).
	calls map[string]int
}

// box is what the sim knows of one sandbox.
type box struct {
	gen     int64  // newest generation started or resumed
	running bool   // the workload of gen runs
	cred    string // credential of gen
	// suspends maps a suspended generation to the reference it produced.
	suspends map[int64]string
	// retained maps live references to the generation they retain.
	retained map[string]int64
	// consumed maps consumed references to the resume that consumed them.
	consumed map[string]consumption
	// attempts counts resume attempts per reference (fail_once).
	attempts map[string]int
	// exitGen is the generation whose exit_after timer is armed or fired.
	exitGen   int64
	exitTimer *time.Timer
	// exitAfter and exitCode come from the options of the newest Start or
	// Resume (reports do not carry options).
	exitAfter time.Duration
	exitCode  int
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

// New returns a sim driver that sends supervisor reports through r.
func New(r compute.Reporter) *Driver {
	ctx, cancel := context.WithCancel(context.Background())
	return &Driver{
		rep:    r,
		ctx:    ctx,
		cancel: cancel,
		quit:   make(chan struct{}),
		queues: map[string][]pending{},
		boxes:  map[string]*box{},
		dead:   map[string]bool{},
		calls:  map[string]int{},
	}
}

// Calls returns how many times each operation (start, stop, suspend,
// resume, discard, delete) was called, failed calls included: what tests
// and the bench check a re-driven saga against.
func (d *Driver) Calls() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.calls)
}

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
}

// Capabilities reports Suspend unless the options say suspend=unimplemented
// or are invalid.
func (d *Driver) Capabilities(opts map[string]string) compute.Capabilities {
	o, err := parse(opts)
	if err != nil {
		return compute.Capabilities{}
	}
	return compute.Capabilities{Suspend: o.suspend != SuspendUnimplemented}
}

// Start marks generation req.Generation running and queues its supervisor's
// attach report. A repeated Start of the same generation queues the attach
// again and has no other effect; a Start of a generation older than the
// newest one seen does nothing.
func (d *Driver) Start(ctx context.Context, req compute.Start) error {
	id := req.Spec.SandboxID
	o, err := d.begin(ctx, "start", req.Spec)
	if err != nil {
		return fmt.Errorf("start %s generation %d: %w", id, req.Generation, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("start %s: %w", id, ErrClosed)
	}
	b := d.boxLocked(id)
	if req.Generation < b.gen {
		return nil
	}
	if req.Generation > b.gen {
		d.disarmLocked(b)
	}
	b.gen, b.running, b.cred = req.Generation, true, req.Credential
	b.exitAfter, b.exitCode = o.exitAfter, o.exitCode
	d.enqueueLocked(pending{r: compute.Report{SandboxID: id, Generation: req.Generation, Credential: req.Credential, Kind: compute.ReportAttached}})
	return nil
}

// Stop marks the generation not running. It is idempotent, and a Stop of
// another generation than the running one changes nothing.
func (d *Driver) Stop(ctx context.Context, t compute.Target) error {
	id := t.Spec.SandboxID
	if _, err := d.begin(ctx, "stop", t.Spec); err != nil {
		return fmt.Errorf("stop %s generation %d: %w", id, t.Generation, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("stop %s: %w", id, ErrClosed)
	}
	if b := d.boxes[id]; b != nil && b.gen == t.Generation {
		b.running = false
		d.disarmLocked(b)
	}
	return nil
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
	b := d.boxLocked(id)
	if ref, ok := b.suspends[gen]; ok {
		d.mu.Unlock()
		return ref, nil
	}
	known := b.gen != 0
	if known && (gen != b.gen || !b.running) {
		d.mu.Unlock()
		return "", fmt.Errorf("suspend %s generation %d: %w: the workload of that generation is not running", id, gen, compute.ErrRejected)
	}
	if !known {
		// The sim forgot this sandbox (the service restarted): it assumes the
		// asked generation runs.
		b.gen, b.running = gen, true
	}
	var exited chan error
	if o.exitDuringSuspend != nil {
		exited = make(chan error, 1)
		d.enqueueLocked(pending{
			r:    compute.Report{SandboxID: id, Generation: gen, Credential: b.cred, Kind: compute.ReportExited, ExitCode: *o.exitDuringSuspend},
			done: exited,
		})
	}
	ref := fmt.Sprintf("sim:%s:%d:%s", id, gen, token())
	b.suspends[gen] = ref
	b.retained[ref] = gen
	b.running = false
	d.disarmLocked(b)
	d.mu.Unlock()

	if exited != nil {
		// The workload exits while the suspension is in flight: its report
		// is out before the answer.
		select {
		case <-exited:
		case <-ctx.Done():
			return "", ctx.Err()
		case <-d.quit:
			return "", fmt.Errorf("suspend %s: %w", id, ErrClosed)
		}
	}
	return ref, nil
}

// Resume restores the retained state behind req.RestoreRef under
// req.Generation as the resume option says, and on success queues the attach
// report of that generation. A repeated Resume of the same (generation,
// reference) answers as the first one did.
func (d *Driver) Resume(ctx context.Context, req compute.Resume) (compute.ResumeResult, error) {
	id, gen, ref := req.Spec.SandboxID, req.Generation, req.RestoreRef
	o, err := d.begin(ctx, "resume", req.Spec)
	if err != nil {
		return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: %w", id, gen, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return compute.ResumeResult{}, fmt.Errorf("resume %s: %w", id, ErrClosed)
	}
	b := d.boxLocked(id)
	attach := pending{r: compute.Report{SandboxID: id, Generation: gen, Credential: req.Credential, Kind: compute.ReportAttached}}

	if c, ok := b.consumed[ref]; ok {
		switch {
		case c.gen != gen:
			return compute.ResumeResult{}, fmt.Errorf("resume %s: %w: %s was consumed by generation %d", id, compute.ErrUnknownRef, ref, c.gen)
		case c.failed:
			return compute.ResumeResult{Consumed: true}, fmt.Errorf("resume %s generation %d: restore failed after consuming %s (resume=fail_after_consume)", id, gen, ref)
		default:
			d.enqueueLocked(attach)
			return compute.ResumeResult{Consumed: true}, nil
		}
	}
	if _, ok := b.retained[ref]; !ok {
		if d.dead[ref] || !strings.HasPrefix(ref, "sim:"+id+":") {
			return compute.ResumeResult{}, fmt.Errorf("resume %s: %w: %q", id, compute.ErrUnknownRef, ref)
		}
		// A well-formed reference the sim forgot across a restart.
		b.retained[ref] = 0
	}

	b.attempts[ref]++
	switch {
	case o.resume == ResumeFail:
		return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: restore failed, %s kept (resume=fail)", id, gen, ref)
	case o.resume == ResumeFailOnce && b.attempts[ref] == 1:
		return compute.ResumeResult{}, fmt.Errorf("resume %s generation %d: restore failed, %s kept (resume=fail_once)", id, gen, ref)
	case o.resume == ResumeFailAfterConsume:
		delete(b.retained, ref)
		b.consumed[ref] = consumption{gen: gen, failed: true}
		return compute.ResumeResult{Consumed: true}, fmt.Errorf("resume %s generation %d: restore failed after consuming %s (resume=fail_after_consume)", id, gen, ref)
	}
	delete(b.retained, ref)
	b.consumed[ref] = consumption{gen: gen}
	if gen > b.gen {
		d.disarmLocked(b)
	}
	b.gen, b.running, b.cred = gen, true, req.Credential
	b.exitAfter, b.exitCode = o.exitAfter, o.exitCode
	d.enqueueLocked(attach)
	return compute.ResumeResult{Consumed: true}, nil
}

// Discard forgets a retained state; it is idempotent.
func (d *Driver) Discard(ctx context.Context, spec compute.Spec, ref string) error {
	if _, err := d.begin(ctx, "discard", spec); err != nil {
		return fmt.Errorf("discard %s: %w", spec.SandboxID, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if b := d.boxes[spec.SandboxID]; b != nil {
		delete(b.retained, ref)
	}
	if _, consumed := d.consumedLocked(spec.SandboxID, ref); !consumed {
		d.dead[ref] = true
	}
	return nil
}

// Delete forgets everything of the sandbox, its retained states included;
// it is idempotent.
func (d *Driver) Delete(ctx context.Context, spec compute.Spec) error {
	if _, err := d.begin(ctx, "delete", spec); err != nil {
		return fmt.Errorf("delete %s: %w", spec.SandboxID, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.boxes[spec.SandboxID]
	if b == nil {
		return nil
	}
	d.disarmLocked(b)
	for ref := range b.retained {
		d.dead[ref] = true
	}
	for ref := range b.consumed {
		d.dead[ref] = true
	}
	delete(d.boxes, spec.SandboxID)
	return nil
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
	if o.latency > 0 {
		t := time.NewTimer(o.latency)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return options{}, ctx.Err()
		case <-d.quit:
			return options{}, ErrClosed
		}
	}
	return o, ctx.Err()
}

func (d *Driver) consumedLocked(id, ref string) (consumption, bool) {
	b := d.boxes[id]
	if b == nil {
		return consumption{}, false
	}
	c, ok := b.consumed[ref]
	return c, ok
}

func (d *Driver) boxLocked(id string) *box {
	b := d.boxes[id]
	if b == nil {
		b = &box{
			suspends: map[int64]string{},
			retained: map[string]int64{},
			consumed: map[string]consumption{},
			attempts: map[string]int{},
		}
		d.boxes[id] = b
	}
	return b
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
// is empty. After an attach is delivered it arms the exit_after timer of that
// generation, so the exit follows the attach.
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

		// A report the Reporter refuses is dropped, as a supervisor that
		// gave up would drop it.
		err := d.rep.Report(d.ctx, p.r)
		if p.done != nil {
			p.done <- err
		}
		if err == nil && p.r.Kind == compute.ReportAttached {
			d.arm(p.r.SandboxID, p.r.Generation)
		}
	}
}

// arm starts the exit_after timer of generation gen, once per generation,
// if the sandbox asks for one and gen still runs.
func (d *Driver) arm(id string, gen int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.boxes[id]
	if d.closed || b == nil || b.gen != gen || !b.running || b.exitGen == gen {
		return
	}
	if b.exitAfter <= 0 {
		return
	}
	b.exitGen = gen
	after, code, cred := b.exitAfter, b.exitCode, b.cred
	d.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(after, func() {
		defer d.wg.Done()
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.closed || d.boxes[id] != b || b.exitTimer != t || b.gen != gen || !b.running {
			return
		}
		b.running, b.exitTimer = false, nil
		d.enqueueLocked(pending{r: compute.Report{SandboxID: id, Generation: gen, Credential: cred, Kind: compute.ReportExited, ExitCode: code}})
	})
	b.exitTimer = t
}

// disarmLocked stops the exit timer of b, if one is armed and has not fired.
func (d *Driver) disarmLocked(b *box) {
	if b.exitTimer != nil && b.exitTimer.Stop() {
		d.wg.Done()
	}
	b.exitTimer = nil
}

// token is a short random string that makes references unguessable.
func token() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
