package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/sagas"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/compute/sim"
)

// The torpor binary the process tests run, built once by binary.
var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

func TestMain(m *testing.M) {
	http.DefaultClient.Transport = tokenTransport{base: http.DefaultTransport}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// binary builds the torpor binary (once per test run) and returns its path.
func binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "torpor-bin-"); buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, "torpor"), ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "torpor")
}

// child is `torpor serve` running as a process of its own.
type child struct {
	cmd  *exec.Cmd
	http string // host:port
	nats string // nats://…
	dir  string // --data
	done chan struct{}
}

// serveProcess starts `torpor serve` on dir with every write synced (a
// kill loses nothing the service acknowledged) and random ports, and waits
// until it says where it listens. It is killed at cleanup.
func serveProcess(t *testing.T, dir string, args ...string) *child {
	t.Helper()
	args = append([]string{"serve", "--data", dir, "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--fsync", "always"}, args...)
	cmd := exec.Command(binary(t), args...)
	// A process group of its own, as a shell gives a job: a signal to the
	// group (a terminal's ^C) reaches what the service started in it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, dir: dir, done: make(chan struct{})}
	up := make(chan struct{})
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if rest, ok := strings.CutPrefix(line, "torpor is up: HTTP on http://"); ok {
				httpAddr, natsURL, _ := strings.Cut(rest, ", NATS on ")
				c.http, c.nats = httpAddr, natsURL
				close(up)
			}
			if testing.Verbose() {
				t.Log("serve: " + line)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	t.Cleanup(c.kill)
	select {
	case <-up:
	case <-c.done:
		t.Fatal("torpor serve exited before it was up")
	case <-time.After(waitFor):
		c.kill()
		t.Fatal("torpor serve did not come up")
	}
	readAdminToken(t, dir, c.http)
	return c
}

// kill sends SIGKILL and waits for the process to end.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// client is an SDK client of the child's HTTP API.
func (c *child) client() *torpor.Client { return torpor.New(c.http, nil).WithToken(tokenFor(c.http)) }

// watch subscribes to sandbox id's subject on the child's NATS and sends
// each event's type on the channel (the subscription ends with the process).
func (c *child) watch(t *testing.T, id string) <-chan string {
	t.Helper()
	nc, err := nats.Connect(c.nats, serviceOptions(t, c.dir)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ch := make(chan string, 64)
	if _, err := nc.Subscribe(jsstore.Subject(id), func(m *nats.Msg) { ch <- m.Header.Get(jsstore.HeaderType) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// awaitEvent waits for an event of type typ on ch.
func awaitEvent(t *testing.T, ch <-chan string, typ string) {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case got := <-ch:
			if got == typ {
				return
			}
		case <-timeout:
			t.Fatalf("no %s in %s", typ, waitFor)
		}
	}
}

// awaitHistory waits until sandbox id's history holds an event of type typ.
func awaitHistory(t *testing.T, c *child, id, typ string) {
	t.Helper()
	awaitHistoryFor(t, c, id, typ, waitFor)
}

// awaitHistoryFor is awaitHistory waiting up to wait.
func awaitHistoryFor(t *testing.T, c *child, id, typ string, wait time.Duration) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		h, err := c.client().History(context.Background(), id, 0)
		for _, e := range h {
			if e.Type == typ {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in the history of %s in %s (%v)", typ, id, wait, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitEffect waits until the sim's journal under dir holds effect e.
func awaitEffect(t *testing.T, dir string, e sim.Effect) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		got, err := sim.Effects(dir)
		if err == nil && got[e] > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %+v in the sim's journal in %s (%v, %v)", e, waitFor, got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// converged waits for the view of id to reach want and then checks, through
// the real binary's `torpor check`, that the log breaks no invariant, and
// in the sim's journal that no effect happened twice.
func converged(t *testing.T, c *child, dir, id string, want events.Phase) events.View {
	t.Helper()
	v, err := c.client().Wait(context.Background(), id, want, waitFor)
	if err != nil {
		t.Fatalf("sandbox %s did not converge to %s: %v (%+v)", id, want, err, v)
	}
	check := exec.Command(binary(t), "check", "--server", "http://"+c.http)
	check.Env = append(os.Environ(), tokenEnv(c.http)...)
	out, err := check.CombinedOutput()
	if err != nil {
		t.Fatalf("torpor check: %v\n%s", err, out)
	}
	effects, err := sim.Effects(dir)
	if err != nil {
		t.Fatal(err)
	}
	for e, n := range effects {
		if n != 1 {
			t.Errorf("effect %+v happened %d times", e, n)
		}
	}
	return v
}

// TestKillDuringSuspendAndResume kills `torpor serve` with SIGKILL at each
// step of a suspend and of a resume, starts it again on the same data
// directory, and checks that the sandbox converges, that no effect of the
// driver happened twice (the sim journals its effects per sandbox,
// generation and operation in the data directory), and that `torpor check`
// finds the log sound.
func TestKillDuringSuspendAndResume(t *testing.T) {
	type step struct {
		name string
		opts map[string]string
		// kill waits for the moment to kill, after the command was sent.
		kill func(t *testing.T, c *child, dir, id string, evs <-chan string)
	}
	afterIntent := func(typ string) func(*testing.T, *child, string, string, <-chan string) {
		return func(t *testing.T, _ *child, _, _ string, evs <-chan string) { awaitEvent(t, evs, typ) }
	}
	afterEffect := func(op string, gen int64) func(*testing.T, *child, string, string, <-chan string) {
		return func(t *testing.T, _ *child, dir, id string, _ <-chan string) {
			awaitEffect(t, dir, sim.Effect{Sandbox: id, Generation: gen, Op: op})
		}
	}
	for _, c := range []struct {
		verb string
		step
	}{
		// The driver's call is under way (latency holds it before its effect).
		{"suspend", step{"after the intent", map[string]string{"latency": "1s"}, afterIntent(events.TypeSuspendRequested)}},
		// The driver suspended it; its answer has not come (answer_delay).
		{"suspend", step{"after the driver's effect, before its answer", map[string]string{"answer_delay": "3s"}, afterEffect("suspend", 1)}},
		{"resume", step{"after the intent", map[string]string{"latency": "1s"}, afterIntent(events.TypeResumeRequested)}},
		// The state is consumed in the driver; nothing recorded, and the
		// restored supervisor not attached yet.
		{"resume", step{"after the driver consumed the state, nothing recorded", map[string]string{"answer_delay": "3s", "attach": "4s"}, afterEffect("resume", 2)}},
		// The saga recorded the consumption (past the point of no return),
		// not yet the restore; the restored supervisor's attach waits for
		// it at the gateway. The restarted saga must record the restore
		// with no second effect.
		{"resume", step{"after the saga recorded the consumption, before the restore", map[string]string{"answer_delay": "3s"}, afterIntent(events.TypeRetainedStateConsumed)}},
	} {
		t.Run(c.verb+" "+c.name, func(t *testing.T) {
			dir := t.TempDir()
			a := serveProcess(t, dir, "--deadline", "30s")
			ctx := context.Background()
			v, err := a.client().Create(ctx, torpor.CreateRequest{Driver: "sim", DriverOptions: c.opts}, "")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.client().Wait(ctx, v.ID, events.PhaseReady, waitFor); err != nil {
				t.Fatal(err)
			}
			want := events.PhaseSuspended
			if c.verb == "resume" {
				acc, err := a.client().Lifecycle(ctx, "suspend", v.ID, false, "")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := a.client().WaitAfter(ctx, v.ID, events.PhaseSuspended, acc.Seq, waitFor); err != nil {
					t.Fatal(err)
				}
				want = events.PhaseReady
			}
			evs := a.watch(t, v.ID)
			if _, err := a.client().Lifecycle(ctx, c.verb, v.ID, false, ""); err != nil {
				t.Fatal(err)
			}
			c.kill(t, a, dir, v.ID, evs)
			a.kill()

			b := serveProcess(t, dir, "--deadline", "30s")
			// The re-driven step's outcome, not only the phase.
			outcome := map[string]string{"suspend": events.TypeSuspended, "resume": events.TypeResumed}[c.verb]
			awaitHistory(t, b, v.ID, outcome)
			got := converged(t, b, dir, v.ID, want)
			if c.verb == "resume" && (got.Generation != 2 || got.LastOutcome != events.OutcomeRestored || got.Restore.Held || !got.Restore.Consumed) {
				t.Fatalf("after the restart: %+v, want restored at generation 2", got)
			}
			if c.verb == "suspend" && (got.Generation != 1 || !got.Restore.Held) {
				t.Fatalf("after the restart: %+v, want suspended, the state held", got)
			}
			h, err := b.client().History(ctx, v.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			counts := map[string]int{}
			for _, e := range h {
				counts[e.Type]++
			}
			for _, typ := range []string{events.TypeSuspendRequested, events.TypeSuspended, events.TypeResumeRequested, events.TypeRetainedStateConsumed, events.TypeResumed} {
				if counts[typ] > 1 {
					t.Errorf("%d × %s in the history, want at most 1", counts[typ], typ)
				}
			}
		})
	}
}

// TestDeadlineAcrossDowntime: the service stops (SIGKILL) with a sandbox
// waiting for its supervisor, stays down past --deadline, and starts again:
// the passed deadline and its compensation are in the log, nothing is stuck.
// A sandbox whose supervisor's attach was only delayed (it is retried across
// the restart) is not failed: it gets the grace and becomes ready.
func TestDeadlineAcrossDowntime(t *testing.T) {
	dir := t.TempDir()
	a := serveProcess(t, dir, "--deadline", "2s")
	ctx := context.Background()
	ok, err := a.client().Create(ctx, torpor.CreateRequest{Driver: "sim"}, "")
	if err != nil {
		t.Fatal(err)
	}
	settled, err := a.client().Wait(ctx, ok.ID, events.PhaseReady, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	never, err := a.client().Create(ctx, torpor.CreateRequest{Driver: "sim", DriverOptions: map[string]string{"attach": "never"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	late, err := a.client().Create(ctx, torpor.CreateRequest{Driver: "sim", DriverOptions: map[string]string{"attach": "1500ms"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	awaitHistory(t, a, never.ID, events.TypeStarted)
	awaitEffect(t, dir, sim.Effect{Sandbox: late.ID, Generation: 1, Op: "start"})
	// The sagas saved their position past the settled sandbox, and not past
	// the start of the phase the others wait in.
	pos := a.sagasPosition(t, func(seq uint64) bool { return seq >= settled.Seq })
	if pos >= never.Seq {
		t.Fatalf("sagas' position %d, past the provisioning entered at %d", pos, never.Seq)
	}
	a.kill()
	// Down past the deadline of both: the clock must move, there is no event to wait for.
	time.Sleep(3 * time.Second)

	b := serveProcess(t, dir, "--deadline", "2s")
	got := converged(t, b, dir, never.ID, events.PhaseError)
	if got.Reason != events.ReasonDeadlineExceeded {
		t.Fatalf("after the restart: %+v, want error with DeadlineExceeded", got)
	}
	h, err := b.client().History(ctx, never.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The passed provisioning deadline, then only its clean-up (asked in
	// the same append, confirmed later by the driver).
	for len(h) > 0 && (h[len(h)-1].Type == events.TypeCleanupRequested || h[len(h)-1].Type == events.TypeCleanedUp) {
		h = h[:len(h)-1]
	}
	if last := h[len(h)-1]; last.Type != events.TypeDeadlinePassed || !strings.Contains(string(last.Data), `"provisioning"`) {
		t.Fatalf("last event %s %s, want the passed provisioning deadline", last.Type, last.Data)
	}
	// The driver was told to clean up: the workload no longer runs.
	awaitEffect(t, dir, sim.Effect{Sandbox: never.ID, Generation: 1, Op: "stop"})
	if v := converged(t, b, dir, late.ID, events.PhaseReady); v.Generation != 1 {
		t.Fatalf("the late attach: %+v", v)
	}
}

// sagasPosition waits until the sagas' saved position satisfies cond and
// returns it.
func (c *child) sagasPosition(t *testing.T, cond func(uint64) bool) uint64 {
	t.Helper()
	nc, err := nats.Connect(c.nats, serviceOptions(t, c.dir)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(waitFor)
	for {
		var seq uint64
		if kv, err := js.KeyValue(context.Background(), jsstore.PositionBucket); err == nil {
			if e, err := kv.Get(context.Background(), sagas.PositionKey("local")); err == nil {
				seq, _ = strconv.ParseUint(string(e.Value()), 10, 64)
			}
		}
		if cond(seq) {
			return seq
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sagas' position stayed at %d for %s", seq, waitFor)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
