// Package python_test runs the Python SDK's unittest suite (sdk/python)
// against a real node: services/node/servetest starts one in this process and
// hands the suite its URL and tokens. python3 missing fails the test under
// CI=true and skips it loudly elsewhere.
package python_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor/torpor/services/node/servetest"
)

// TestPythonSDK: every test of sdk/python/tests, the scenarios of
// sdk/scenarios/scenarios.json among them, passes against a real server.
func TestPythonSDK(t *testing.T) {
	python := servetest.Need(t, "python3")
	s := servetest.Start(t)
	scenarios, err := filepath.Abs(filepath.Join("..", "scenarios", "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	env := append(s.Env(), "TORPOR_SCENARIOS="+scenarios, "PYTHONPATH=src", "PYTHONDONTWRITEBYTECODE=1")
	out := servetest.Run(t, ".", env, 5*time.Minute, python, "-m", "unittest", "discover", "-s", "tests", "-v")
	// unittest prints "OK (skipped=N)" when a test skipped: none may here,
	// the server is up.
	if strings.Contains(out, "skipped") {
		t.Errorf("the suite skipped tests against a running server")
	}
}

// TestPythonSDKWithoutServer: with no server in its environment the suite's
// server tests skip loudly, and fail under CI=true.
func TestPythonSDKWithoutServer(t *testing.T) {
	python := servetest.Need(t, "python3")
	env := []string{"TORPOR_URL=", "PYTHONDONTWRITEBYTECODE=1"}
	out := servetest.Run(t, "tests", append(env, "CI="), time.Minute, python, "-m", "unittest", "test_server")
	if !strings.Contains(out, "SKIPPING: no server") {
		t.Errorf("no loud skip without a server:\n%s", out)
	}
	cmd := exec.Command(python, "-m", "unittest", "test_server")
	cmd.Dir = "tests"
	cmd.Env = append(os.Environ(), append(env, "CI=true")...)
	ciOut, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("under CI=true the suite passed without a server:\n%s", ciOut)
	}
	if !strings.Contains(string(ciOut), "CI=true") {
		t.Errorf("under CI=true the failure does not say why:\n%s", ciOut)
	}
}
