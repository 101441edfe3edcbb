package main

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/torpor/torpor/"

// allowed says, for each of our packages (by prefix), which of our packages
// it may depend on (transitively), as DESIGN.md draws the arrows: everything
// points toward events, and nothing but cmd/torpor reaches gateway, sagas or
// projections.
var allowed = []struct {
	pkg  string
	deps []string
}{
	{"internal", []string{"internal"}}, // helpers of no domain: leaves, like events
	{"events", []string{"events", "internal"}},
	{"services/compute", []string{"services/compute", "events", "internal"}},
	{"services/gateway", []string{"services/gateway", "services/compute", "events", "internal"}},
	{"sagas", []string{"sagas", "services/compute", "events", "internal"}},
	{"projections", []string{"projections", "events", "internal"}},
	{"sdk/go", []string{"sdk/go", "events"}},
	{"cmd/torpor", nil}, // wires everything
	// The bench drives the whole service as users and operators do (its log,
	// views, sagas' position, the SDK), so like cmd/torpor it may reach
	// every package; nothing but cmd/torpor may reach it.
	{"bench", nil},
}

func under(path, prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }

// TestImportArrows checks the dependency arrows with `go list -deps`.
func TestImportArrows(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Deps " "}}`, module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, deps, _ := strings.Cut(line, ":")
		pkg = strings.TrimPrefix(pkg, module)
		var rule []string
		found := false
		for _, a := range allowed {
			if under(pkg, a.pkg) {
				rule, found = a.deps, true
				break
			}
		}
		if !found {
			t.Errorf("package %s has no rule in the arrows table", pkg)
			continue
		}
		if rule == nil { // cmd/torpor and the bench: anything of ours
			continue
		}
		checked++
		for _, d := range strings.Fields(deps) {
			if !strings.HasPrefix(d, module) {
				continue
			}
			d = strings.TrimPrefix(d, module)
			ok := false
			for _, r := range rule {
				if under(d, r) {
					ok = true
				}
			}
			if !ok {
				t.Errorf("%s depends on %s: DESIGN.md's arrows forbid it", pkg, d)
			}
		}
	}
	if checked < 5 {
		t.Fatalf("checked %d packages; go list found too few", checked)
	}
}

// TestBenchImportedByCmdAlone: the bench harness is imported by cmd/torpor
// and by nothing else of ours, not even a test: it starts the whole
// service, and a package that leaned on it would carry the bench (pgx,
// cockroach-go, the load generators) along.
func TestBenchImportedByCmdAlone(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}:{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	importers := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		pkg = strings.TrimPrefix(pkg, module)
		for _, imp := range strings.Fields(imports) {
			if imp != module+"bench" || under(pkg, "bench") {
				continue
			}
			if pkg != "cmd/torpor" {
				t.Errorf("%s imports bench: only cmd/torpor may", pkg)
				continue
			}
			importers++
		}
	}
	if importers == 0 {
		t.Error("cmd/torpor does not import bench: go list found no importer at all")
	}
}
