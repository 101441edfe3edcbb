package web_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/check"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/node/servetest"
)

// updateShot copies the list's screenshot to docs/dashboard.png.
var updateShot = flag.Bool("update-screenshot", false, "copy the browser test's list screenshot to docs/dashboard.png")

// shotsDir keeps the screenshots there instead of the test's temp dir.
var shotsDir = flag.String("shots", "", "write the browser test's screenshots to this directory (default: the test's temp dir)")

// browser is what the browser tests need: node, Debian's chromium and the
// driver (playwright-core, pinned by web/e2e/package-lock.json).
func browser(t *testing.T) (node, chromium string) {
	t.Helper()
	if testing.Short() {
		t.Skip("a browser against a real node: not with -short")
	}
	node = servetest.Need(t, "node")
	chromium = servetest.Need(t, "chromium")
	servetest.NeedDir(t, filepath.Join("e2e", "node_modules", "playwright-core"), "cd web/e2e && npm ci")
	return node, chromium
}

// startChecked starts a node for t whose log the invariant checker reads
// at t's end (before the node stops: cleanups run last first).
func startChecked(t *testing.T) *servetest.Server {
	t.Helper()
	s := servetest.Start(t)
	t.Cleanup(func() {
		vs, err := check.Replay(context.Background(), s.Node.Store(), check.Options{Deadline: s.Deadline, Slack: 10 * time.Second, Now: time.Now()})
		if err != nil {
			t.Errorf("check the log: %v", err)
		}
		for _, v := range vs {
			t.Errorf("the log breaks an invariant: %v", v)
		}
	})
	return s
}

// sandbox is one of the sandboxes the dashboard is shown, made through the
// Go SDK with the admin token, and the lifecycle it is taken through first.
type sandbox struct {
	name   string
	labels map[string]string
	opts   map[string]string
	then   func(ctx context.Context, c *torpor.Client, id string) error
}

func suspended(ctx context.Context, c *torpor.Client, id string) error {
	if _, err := c.Suspend(ctx, id); err != nil {
		return err
	}
	_, err := c.Wait(ctx, id, events.PhaseSuspended, 30*time.Second)
	return err
}

// TestDashboardInBrowser drives the dashboard in headless Chromium against
// a real node: with the write token it signs in, sees the counts the API
// answers, suspends a sandbox through the page and sees its row turn
// suspended without a reload, finds the transitions in its timeline with
// actor and outcome, resumes it, and takes screenshots; with the read
// token it finds no action buttons, and a suspend forged from the page is
// PERMISSION_DENIED (web/e2e/dashboard.mjs).
func TestDashboardInBrowser(t *testing.T) {
	node, chromium := browser(t)
	s := startChecked(t)
	c := torpor.New(s.URL, nil).WithToken(s.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, sb := range []sandbox{
		{name: "web-1", labels: map[string]string{"team": "web"}},
		{name: "web-2", labels: map[string]string{"team": "web"}},
		{name: "db-1", labels: map[string]string{"team": "db"}, then: suspended},
		{name: "batch-1", labels: map[string]string{"team": "batch"}, then: func(ctx context.Context, c *torpor.Client, id string) error {
			if _, err := c.Stop(ctx, id); err != nil {
				return err
			}
			_, err := c.Wait(ctx, id, events.PhaseStopped, 30*time.Second)
			return err
		}},
		// A resume whose restore fails after consuming the state, allowed
		// a cold start: outcome cold_start_fallback.
		{name: "flaky-1", opts: map[string]string{"resume": "fail_after_consume"}, then: func(ctx context.Context, c *torpor.Client, id string) error {
			if err := suspended(ctx, c, id); err != nil {
				return err
			}
			if _, err := c.Resume(ctx, id, torpor.ResumeOptions{RestartIfRestoreFails: true}, ""); err != nil {
				return err
			}
			_, err := c.Wait(ctx, id, events.PhaseReady, 30*time.Second)
			return err
		}},
		// A restore that fails before consuming: outcome restore_failed,
		// back to suspended.
		{name: "cache-1", opts: map[string]string{"resume": "fail"}, then: func(ctx context.Context, c *torpor.Client, id string) error {
			if err := suspended(ctx, c, id); err != nil {
				return err
			}
			v, err := c.Resume(ctx, id, torpor.ResumeOptions{}, "")
			if err != nil {
				return err
			}
			_, err = c.WaitAfter(ctx, id, events.PhaseSuspended, v.Seq, 30*time.Second)
			return err
		}},
		// A suspend that never answers: suspending, against the deadline.
		{name: "stuck-1", opts: map[string]string{"suspend": "hang"}, then: func(ctx context.Context, c *torpor.Client, id string) error {
			_, err := c.Suspend(ctx, id)
			return err
		}},
	} {
		v, err := c.Create(ctx, torpor.CreateRequest{Name: sb.name, Driver: "sim", Labels: sb.labels, DriverOptions: sb.opts}, "")
		if err != nil {
			t.Fatalf("create %s: %v", sb.name, err)
		}
		if _, err := c.Wait(ctx, v.ID, events.PhaseReady, 30*time.Second); err != nil {
			t.Fatalf("%s ready: %v", sb.name, err)
		}
		if sb.then != nil {
			if err := sb.then(ctx, c, v.ID); err != nil {
				t.Fatalf("%s: %v", sb.name, err)
			}
		}
	}
	shots := t.TempDir()
	if *shotsDir != "" {
		shots = *shotsDir
	}
	env := append(s.Env(), "CHROMIUM="+chromium, "SHOTS="+shots, "TARGET=web-1", "SUSPENDED=db-1")
	servetest.Run(t, "e2e", env, 90*time.Second, node, "dashboard.mjs", "write")
	servetest.Run(t, "e2e", env, 60*time.Second, node, "dashboard.mjs", "read")
	for _, name := range []string{"list.png", "sandbox.png", "list-phone.png", "sandbox-phone.png"} {
		data, err := os.ReadFile(filepath.Join(shots, name))
		if err != nil || !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("screenshot %s: not a PNG (%d bytes, %v)", name, len(data), err)
		}
	}
	if *updateShot {
		data, err := os.ReadFile(filepath.Join(shots, "list.png"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "docs", "dashboard.png"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshots in %s", shots)
}

// TestDashboardFirstPaint10k measures the dashboard's first paint (from
// navigation to the table's first rows visible) with 10,000 sandboxes in
// the view, in creation order and sorted by age in phase. It prints the
// times; it asserts none (a benchmark).
func TestDashboardFirstPaint10k(t *testing.T) {
	node, chromium := browser(t)
	s := startChecked(t)
	const n = 10000
	bus, err := torpor.NewBus(s.Node.Conn())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Creates on the bus (no HTTP rate or per-token sandbox quota), 64 in
	// flight: the sim driver starts each, as it would any.
	start := time.Now()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	for range 64 {
		wg.Go(func() {
			for i := next.Add(1); i <= n && ctx.Err() == nil; i = next.Add(1) {
				_, err := bus.Create(ctx, torpor.CreateRequest{Name: fmt.Sprintf("load-%05d", i), Driver: "sim", Labels: map[string]string{"batch": fmt.Sprint(i % 10)}}, "")
				if err != nil {
					errMu.Lock()
					first = cmpErr(first, err)
					errMu.Unlock()
					cancel()
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		t.Fatalf("create: %v", first)
	}
	created := time.Since(start)
	// Every create in the KV view the page lists from.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		lag, err := s.Node.ViewLag(ctx)
		if err == nil && lag == 0 {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("the view did not catch up: lag %d, %v", lag, err)
		}
	}
	t.Logf("%d sandboxes created on the bus in %s, in the view after %s", n, created.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	env := append(s.Env(), "CHROMIUM="+chromium, "SHOTS="+t.TempDir(), fmt.Sprintf("SANDBOXES=%d", n))
	servetest.Run(t, "e2e", env, 60*time.Second, node, "dashboard.mjs", "paint") // it prints the times
}

// TestPageModulesUnderNode runs the page's modules under node, no
// browser, no npm package: the watch client (ui/watch.js) parses the
// events the same however the stream is cut and resumes a dropped stream
// with Last-Event-ID (e2e/watch.test.mjs); a transient sandbox is judged
// against the deadline and the timeline's outcomes are told apart
// (e2e/ui.test.mjs).
func TestPageModulesUnderNode(t *testing.T) {
	node := servetest.Need(t, "node")
	servetest.Run(t, "e2e", nil, 30*time.Second, node, "--test", "watch.test.mjs", "ui.test.mjs")
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
