package main

import (
	"bytes"
	"context"
	"os"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/node"
)

// TestWarnRoot: serve and driver, as root, warn once at start that the
// process driver's workloads run as root, unless --run-as names a user.
func TestWarnRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED, NOT PASSED: the warning is root's")
	}
	for _, tc := range []struct {
		runAs string
		want  int
	}{{"", 1}, {"nobody", 0}} {
		var buf bytes.Buffer
		node.WarnRoot(zerolog.New(&buf), tc.runAs)
		if got := strings.Count(buf.String(), `"level":"warn"`); got != tc.want || (got > 0 && !strings.Contains(buf.String(), "--run-as")) {
			t.Errorf("run as %q: logged %q, want %d warning(s) naming --run-as", tc.runAs, buf.String(), tc.want)
		}
	}
}

// TestServeRunAs: serve --run-as passes the user to the process driver: a
// process sandbox's workload runs as nobody.
func TestServeRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED, NOT PASSED: only root can run a workload as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("SKIPPED, NOT PASSED: no user nobody: %v", err)
	}
	_, c, _ := processApp(t, 3*time.Second, func(c *serveConfig) { c.RunAs = "nobody" })
	ctx := context.Background()
	v, err := c.Create(ctx, torpor.CreateRequest{Driver: "process", Command: []string{"sh", "-c", "/usr/bin/id -u; exec sleep 3600"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	mustWait(t, c, v.ID, events.PhaseReady)
	var out []byte
	eventually(t, "the workload's uid", func() bool {
		out, err = c.Logs(ctx, v.ID, 10)
		return err == nil && len(out) > 0
	})
	if got := strings.TrimSpace(string(out)); got != nobody.Uid {
		t.Fatalf("the workload runs as uid %q, want nobody's, %s", got, nobody.Uid)
	}
}
