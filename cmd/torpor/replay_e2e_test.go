package main

import (
	"strings"
	"testing"
)

// TestServeReplay: `torpor replay` against serve as it is wired (the
// handler mounted beside the API, the SQL view from --projection-db):
// each view is rebuilt from the log and swapped in, and every read answers
// after it as before; a view of the past is built beside the live one.
func TestServeReplay(t *testing.T) {
	db, _ := sqlSchema(t)
	a := startApp(t, t.TempDir(), func(c *serveConfig) { c.ProjectionDB, c.ReadFrom = db, "sql" })
	ids := driveSandboxes(t, a, "rp", 6)
	viewsCaughtUp(t, a)
	before := apiReads(t, a, ids)
	server := "http://" + a.HTTPAddr()
	for _, view := range []string{"kv", "sql"} {
		code, out, errOut := cli(t, server, "replay", "--view", view)
		if code != 0 || !strings.Contains(out, "replay "+view+": done at seq ") || !strings.Contains(out, "swapped in") {
			t.Fatalf("replay --view %s: exit %d, stdout %q, stderr %q", view, code, out, errOut)
		}
		viewsCaughtUp(t, a)
		sameReads(t, apiReads(t, a, ids), before)
	}
	code, out, errOut := cli(t, server, "replay", "--view", "sql", "--until", "5")
	if code != 0 || !strings.Contains(out, "built beside the live view as torpor_sandboxes_at_5") {
		t.Fatalf("replay --view sql --until 5: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	sameReads(t, apiReads(t, a, ids), before)
}
