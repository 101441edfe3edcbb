package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// ansi matches the escape sequences a terminal program writes: CSI
// sequences (cursor moves, colours, erasing), OSC strings and the short
// ESC ones (keypad modes, charsets).
var ansi = regexp.MustCompile(`\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78MDEc]`)

// stripANSI is what a reader of the screen sees of s, as plain text.
func stripANSI(s string) string { return ansi.ReplaceAllString(s, "") }

// ptySession is the torpor binary running on a pseudo-terminal (stdin,
// stdout and stderr), as in a terminal of its own.
type ptySession struct {
	t    *testing.T
	tty  *os.File
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	read chan struct{} // closed when the terminal has no more output
}

// startPTY runs the binary with args on a new 120×40 pseudo-terminal.
func startPTY(t *testing.T, args ...string) *ptySession {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Env = append(append(cliEnv(), tokenEnv(serverArg(args))...), "TERM=xterm-256color")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	s := &ptySession{t: t, tty: tty, cmd: cmd, read: make(chan struct{})}
	go func() {
		defer close(s.read)
		buf := make([]byte, 4096)
		for {
			n, err := tty.Read(buf)
			s.mu.Lock()
			s.out.Write(buf[:n])
			s.mu.Unlock()
			answerQueries(tty, buf[:n])
			if err != nil {
				return // EIO once the program is gone
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		tty.Close()
		<-s.read
	})
	return s
}

// answerQueries answers what a program asks the terminal in out as a
// terminal does: its background colour (OSC 11) and the cursor position
// (DSR). Bubble Tea asks both when the binary starts on a terminal
// (through Lip Gloss), and waits 5 seconds for an answer that never comes.
func answerQueries(tty *os.File, out []byte) {
	if bytes.Contains(out, []byte("\x1b]11;?")) {
		_, _ = io.WriteString(tty, "\x1b]11;rgb:0000/0000/0000\x1b\\")
	}
	if bytes.Contains(out, []byte("\x1b[6n")) {
		_, _ = io.WriteString(tty, "\x1b[1;1R")
	}
}

// screen is all the session printed so far, escapes stripped.
func (s *ptySession) screen() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return stripANSI(s.out.String())
}

// expect waits until what the session printed matches re.
func (s *ptySession) expect(re string) {
	s.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(waitFor)
	for !rx.MatchString(s.screen()) {
		if time.Now().After(deadline) {
			s.t.Fatalf("the terminal never showed %q; it shows:\n%s", re, s.screen())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// send types text on the terminal.
func (s *ptySession) send(text string) {
	s.t.Helper()
	if _, err := io.WriteString(s.tty, text); err != nil {
		s.t.Fatal(err)
	}
}

// exit waits for the program to end and returns its exit status.
func (s *ptySession) exit() int {
	s.t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		select { // what it printed last
		case <-s.read:
		case <-time.After(waitFor):
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			s.t.Fatal(err)
		}
		return 0
	case <-time.After(waitFor):
		s.t.Fatalf("the program did not exit; the terminal shows:\n%s", s.screen())
		return -1
	}
}

// TestTop drives `torpor top` in a pseudo-terminal: it shows the count of
// a ready sandbox, then, when the sandbox is suspended while it runs, the
// suspended count and the transitions; q quits it with status 0. Without a
// terminal it prints one snapshot and exits.
func TestTop(t *testing.T) {
	a := startApp(t, "", nil)
	srv := "http://" + a.HTTPAddr()
	c := appClient(a)
	ctx := context.Background()
	v, err := c.Create(ctx, torpor.CreateRequest{Name: "topped", Labels: map[string]string{"screen": "top"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	// Another sandbox, outside the label filter: its suspension counts nowhere.
	o, _ := c.Create(ctx, torpor.CreateRequest{Name: "elsewhere"}, "")
	mustWait(t, c, o.ID, events.PhaseReady)

	s := startPTY(t, "--server", srv, "top", "-l", "screen=top", "--deadline", "90s")
	s.expect(`(?m)^ready\s+1\s*$`)
	s.expect(`TRANSIENT \(deadline 1m30s\)`)
	if _, err := c.Lifecycle(ctx, "suspend", o.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, o.ID, events.PhaseSuspended)
	if _, err := c.Lifecycle(ctx, "suspend", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	s.expect(`(?m)^suspended\s+1\s*$`)
	s.expect(`topped\s+(ready|suspending) → suspended`)
	// Resumed while it runs: the transition into ready says what the
	// resume took, from the command accepted (README "Resume latency"; the
	// sim says no driver stage, its attach is ready).
	if _, err := c.Resume(ctx, v.ID, torpor.ResumeOptions{}, ""); err != nil {
		t.Fatal(err)
	}
	s.expect(`topped\s+(suspended|starting) → ready.*resume →ready \d`)
	mustWait(t, c, v.ID, events.PhaseReady)
	if _, err := c.Lifecycle(ctx, "suspend", v.ID, false, ""); err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseSuspended)
	if strings.Contains(s.screen(), "elsewhere") {
		t.Errorf("top -l screen=top showed a sandbox without the label:\n%s", s.screen())
	}
	s.send("q")
	if code := s.exit(); code != 0 {
		t.Fatalf("top after q: exit %d\n%s", code, s.screen())
	}

	// Not on a terminal: one snapshot, judged against the deadline the
	// server runs with (startApp's 10s) when --deadline does not say.
	code, out, stderr := torporRun(t, srv, nil, "top")
	if code != 0 || !regexp.MustCompile(`(?m)^suspended\s+2\s*$`).MatchString(out) || !strings.Contains(out, "2 sandboxes") {
		t.Fatalf("top without a terminal: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(out, "TRANSIENT (deadline 10s)") {
		t.Errorf("top without --deadline against a server with a 10s one shows:\n%s", out)
	}
}
