package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// TestServeConfigValidate: every flag serve cannot work with is refused
// before anything starts, naming the flag.
func TestServeConfigValidate(t *testing.T) {
	good := serveConfig{Data: t.TempDir(), HTTP: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Fsync: "always", Node: "local", Deadline: time.Minute, DuplicateWindow: time.Minute, HeartbeatLimit: 15 * time.Second}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, runAs := range []string{"root", "0", "65534:65534"} {
		c := good
		c.RunAs = runAs
		if err := c.Validate(); err != nil {
			t.Errorf("run as %q: %v", runAs, err)
		}
	}
	for _, node := range []string{"n", "rack_1-b", strings.Repeat("n", 63)} {
		c := good
		c.Node = node
		if err := c.Validate(); err != nil {
			t.Errorf("node %q: %v", node, err)
		}
	}
	cases := []struct {
		name, flag string
		edit       func(*serveConfig)
	}{
		{"fsync", "--fsync", func(c *serveConfig) { c.Fsync = "sometimes" }},
		{"deadline", "--deadline", func(c *serveConfig) { c.Deadline = 0 }},
		{"no duplicate window", "--duplicate-window", func(c *serveConfig) { c.DuplicateWindow = 0 }},
		{"duplicate window under a second", "--duplicate-window", func(c *serveConfig) { c.DuplicateWindow = 500 * time.Millisecond }},
		{"no heartbeat limit", "--heartbeat-limit", func(c *serveConfig) { c.HeartbeatLimit = 0 }},
		{"a heartbeat limit too short to beat within", "--heartbeat-limit", func(c *serveConfig) { c.HeartbeatLimit = 2 * time.Nanosecond }},
		{"no data", "--data", func(c *serveConfig) { c.Data = "" }},
		{"no http", "--http", func(c *serveConfig) { c.HTTP = "" }},
		{"nats listen", "--nats-listen", func(c *serveConfig) { c.NATSListen = "nowhere" }},
		{"nats listen port", "--nats-listen", func(c *serveConfig) { c.NATSListen = "127.0.0.1:nats" }},
		{"empty node", "--node", func(c *serveConfig) { c.Node = "" }},
		{"node with a dot", "--node", func(c *serveConfig) { c.Node = "rack.1" }},
		{"node with a wildcard", "--node", func(c *serveConfig) { c.Node = "n*" }},
		{"node too long", "--node", func(c *serveConfig) { c.Node = strings.Repeat("n", 64) }},
		{"upper-case node", "--node", func(c *serveConfig) { c.Node = "Rack1" }},
		{"node ending in a dash", "--node", func(c *serveConfig) { c.Node = "rack-" }},
		{"run as an unknown user", "--run-as", func(c *serveConfig) { c.RunAs = "no-such-user-torpor" }},
		{"run as no uid:gid", "--run-as", func(c *serveConfig) { c.RunAs = "1:x" }},
		{"negative log bound", "--max-log-bytes", func(c *serveConfig) { c.MaxLogBytes = -2 }},
		{"negative replay ttl", "--replay-ttl", func(c *serveConfig) { c.ReplayTTL = -time.Hour }},
		{"negative activity window", "--activity-window", func(c *serveConfig) { c.ActivityWindow = -time.Second }},
		{"negative http read header timeout", "--http-read-header-timeout", func(c *serveConfig) { c.HTTPTimeouts.ReadHeader = -time.Second }},
		{"negative http read timeout", "--http-read-timeout", func(c *serveConfig) { c.HTTPTimeouts.Read = -time.Second }},
		{"negative http write timeout", "--http-write-timeout", func(c *serveConfig) { c.HTTPTimeouts.Write = -time.Second }},
		{"negative http idle timeout", "--http-idle-timeout", func(c *serveConfig) { c.HTTPTimeouts.Idle = -time.Second }},
		{"negative retain for", "--retain-for", func(c *serveConfig) { c.RetainFor = -time.Second }},
		{"negative wake timeout", "--wake-timeout", func(c *serveConfig) { c.WakeTimeout = -time.Second }},
		{"negative wake max held", "--wake-max-held", func(c *serveConfig) { c.WakeMaxHeld = -1 }},
		{"negative idle after", "--idle-after", func(c *serveConfig) { c.IdleAfter = -time.Second }},
		{"idle after within the activity window", "--idle-after", func(c *serveConfig) { c.IdleAfter = 10 * time.Second }},
		{"unknown idle action", "--idle-action", func(c *serveConfig) { c.IdleAfter, c.IdleAction = time.Hour, "delete" }},
		{"unknown idle fallback", "--idle-fallback", func(c *serveConfig) { c.IdleAfter, c.IdleFallback = time.Hour, "suspend" }},
		{"idle action without idle after", "--idle-after", func(c *serveConfig) { c.IdleAction = "stop" }},
	}
	for _, tc := range cases {
		c := good
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s: Validate = %v, want an error naming %s", tc.name, err, tc.flag)
		}
	}
}

// TestDuplicateWindowReachesStream: --duplicate-window sets how long the
// event stream remembers message ids, and a restart with another window
// changes the existing stream's.
func TestDuplicateWindowReachesStream(t *testing.T) {
	dir := t.TempDir()
	for _, want := range []time.Duration{30 * time.Second, 3 * time.Minute} {
		a := startApp(t, dir, func(c *serveConfig) { c.DuplicateWindow = want })
		info, err := a.Store().Stream().Info(t.Context())
		if err != nil {
			t.Fatalf("stream info: %v", err)
		}
		if got := info.Config.Duplicates; got != want {
			t.Errorf("duplicate window: got %s, want %s", got, want)
		}
		if err := a.Stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
}

// TestMaxLogBytesReachesStream: --max-log-bytes bounds the event stream,
// and a restart with another bound changes the existing stream's.
func TestMaxLogBytesReachesStream(t *testing.T) {
	dir := t.TempDir()
	for _, want := range []int64{256 << 20, 512 << 20} {
		a := startApp(t, dir, func(c *serveConfig) { c.MaxLogBytes = want })
		info, err := a.Store().Stream().Info(t.Context())
		if err != nil {
			t.Fatalf("stream info: %v", err)
		}
		if got := info.Config.MaxBytes; got != want {
			t.Errorf("max bytes: got %d, want %d", got, want)
		}
		if err := a.Stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
}

// TestServeReapsViewsOfThePast: serve removes a view of the past once
// --replay-ttl has passed since it was made.
func TestServeReapsViewsOfThePast(t *testing.T) {
	a := startApp(t, "", func(c *serveConfig) { c.ReplayTTL = time.Millisecond })
	js, err := jetstream.New(a.Conn())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "torpor_phases_at_7"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second) // the reaper runs every second at this TTL
	for {
		_, err := js.KeyValue(t.Context(), "torpor_phases_at_7")
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("torpor_phases_at_7 still there (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHTTPTimeoutFlags: serve refuses an HTTP timeout flag that is not a
// positive duration (INVALID_ARGUMENT, naming the flag, nothing started),
// and one it takes reaches the HTTP server: with --http-idle-timeout 200ms
// a kept-alive connection left idle is closed by the server within a few
// seconds, where the default would hold it two minutes.
func TestHTTPTimeoutFlags(t *testing.T) {
	for _, tc := range []struct{ flag, value string }{
		{"--http-read-header-timeout", "0s"},
		{"--http-read-timeout", "-1s"},
		{"--http-write-timeout", "soon"},
		{"--http-idle-timeout", "0"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"serve", "--data", t.TempDir(), "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", tc.flag, tc.value}, &out, &errb)
		if code != exitStatus(events.CodeInvalidArgument) || !strings.HasPrefix(errb.String(), "torpor: INVALID_ARGUMENT: ") || !strings.Contains(errb.String(), tc.flag) {
			t.Errorf("serve %s %s: exit %d, stderr %q; want INVALID_ARGUMENT naming %s", tc.flag, tc.value, code, errb.String(), tc.flag)
		}
	}

	// A free port for serve's --http (run cannot tell which :0 it took).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "--data", dir, "--http", addr, "--nats-listen", "127.0.0.1:0", "--fsync", "interval", "--http-idle-timeout", "200ms"}, io.Discard, &errb)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, errb.String())
		}
	})
	untilTrue(t, "serve answers /healthz", func() (bool, string) {
		select {
		case code := <-done:
			done <- code
			t.Fatalf("serve exited %d: %s", code, errb.String())
		default:
		}
		resp, err := anonymous.Get("http://" + addr + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: "+addr+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /healthz: %s, close %v; want 200 on a kept-alive connection", resp.Status, resp.Close)
	}
	idle := time.Now()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("an idle kept-alive connection after %s: %v, want closed by the server (EOF)", time.Since(idle).Round(time.Millisecond), err)
	}
	if d := time.Since(idle); d > 5*time.Second {
		t.Fatalf("the idle connection was closed after %s, want about 200ms", d)
	}
}

// TestServeReapsSQLViewsOfThePast: serve drops the SQL view's tables of the
// past (torpor replay --view sql --until) once --replay-ttl has passed since
// they were made, on a real PostgreSQL; the live tables stay.
func TestServeReapsSQLViewsOfThePast(t *testing.T) {
	db, schema := sqlSchema(t)
	a := startApp(t, "", func(c *serveConfig) { c.ProjectionDB, c.ReplayTTL = db, time.Millisecond })
	driveSandboxes(t, a, "rt", 5)
	viewsCaughtUp(t, a)
	code, out, errOut := cli(t, "http://"+a.HTTPAddr(), "replay", "--view", "sql", "--until", "3")
	if code != 0 || !strings.Contains(out, "torpor_sandboxes_at_3") {
		t.Fatalf("replay --view sql --until 3: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	tables := func(like string) string {
		return psql(t, testDatabase(t), "SELECT count(*) FROM information_schema.tables WHERE table_schema = '"+schema+"' AND table_name LIKE '"+like+"'")
	}
	untilTrue(t, "the tables of the past at 3 dropped", func() (bool, string) { // the reaper runs every second at this TTL
		n := tables("torpor\\_%\\_at\\_3")
		return n == "0", n + " tables at 3"
	})
	if n := tables("torpor\\_sandboxes"); n != "1" {
		t.Errorf("%s live torpor_sandboxes tables, want 1", n)
	}
}
