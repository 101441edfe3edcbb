package ts_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor/torpor/services/node/servetest"
)

// TestTypeScriptSDK compiles the TypeScript SDK and its tests (tsc, from
// node_modules: .ci/run fills it with `npm ci` in sdk/ts; this test fetches
// nothing) and runs them with Node's test runner against a real node: the
// verbs, the typed errors, retries under one key, a watch resumed after a
// drop, and every scenario of sdk/scenarios/scenarios.json.
func TestTypeScriptSDK(t *testing.T) {
	node := servetest.Need(t, "node")
	servetest.NeedDir(t, "node_modules", "cd sdk/ts && npm ci")
	// A file gone from src must not linger in dist (api.txt is read from it).
	if err := os.RemoveAll("dist"); err != nil {
		t.Fatal(err)
	}
	servetest.Run(t, ".", nil, 3*time.Minute, node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", ".")
	s := servetest.Start(t)
	scenarios, err := filepath.Abs(filepath.Join("..", "scenarios", "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	env := append(s.Env(), "TORPOR_SCENARIOS="+scenarios)
	tests, err := filepath.Glob(filepath.Join("dist", "test", "*.test.js"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no tests compiled into dist/test (%v)", err)
	}
	servetest.Run(t, ".", env, 5*time.Minute, node, append([]string{"--test", "--test-reporter=spec"}, tests...)...)
}
