package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/rs/zerolog"
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
		warnRoot(zerolog.New(&buf), tc.runAs)
		if got := strings.Count(buf.String(), `"level":"warn"`); got != tc.want || (got > 0 && !strings.Contains(buf.String(), "--run-as")) {
			t.Errorf("run as %q: logged %q, want %d warning(s) naming --run-as", tc.runAs, buf.String(), tc.want)
		}
	}
}
