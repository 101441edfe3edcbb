package main

import (
	"os/exec"
	"slices"
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
	{"services/forward", []string{"services/forward", "events", "internal"}},
	{"sagas", []string{"sagas", "services/compute", "events", "internal"}},
	// The SQL view's schema is deploy/sql's migrations, embedded: data, no code.
	{"projections", []string{"projections", "events", "internal", "deploy/sql"}},
	{"deploy", []string{"deploy"}}, // embedded manifests, leaves
	{"services/access", []string{"services/access", "events", "internal"}},
	{"sdk/go", []string{"sdk/go", "events"}},
	// The TypeScript and Python SDKs: no Go but their tests', which start a
	// node (services/node/servetest) and run the suites in their languages.
	{"sdk/ts", []string{}},
	{"sdk/python", []string{}},
	// The dashboard's static files, embedded, and their contract errors.
	{"web", []string{"web", "events"}},
	{"services/node", nil}, // assembles the parts below
	{"cmd/torpor", nil},    // flags, the CLI, and services/node
	// The bench drives the whole service as users and operators do (its log,
	// views, sagas' position, the SDK), so like cmd/torpor it may reach
	// every package; nothing but cmd/torpor may reach it.
	{"bench", nil},
}

func under(path, prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }

// ourPackages runs go list over the module with fields, a template of the
// package's lists (".Deps", ".Imports" ...), and returns for each package
// of ours, by its path in the module, the paths those lists hold.
func ourPackages(t *testing.T, fields ...string) map[string][]string {
	t.Helper()
	var tmpl strings.Builder
	tmpl.WriteString("{{.ImportPath}}")
	for _, f := range fields {
		tmpl.WriteString(" {{join " + f + ` " "}}`)
	}
	out, err := exec.Command("go", "list", "-f", tmpl.String(), module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkgs[strings.TrimPrefix(f[0], module)] = f[1:]
	}
	return pkgs
}

// TestImportArrows checks the dependency arrows with `go list -deps`.
func TestImportArrows(t *testing.T) {
	checked := 0
	for pkg, deps := range ourPackages(t, ".Deps") {
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
		for _, d := range deps {
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

// TestPartsBehindTheNode: the domain's parts (the gateway, the sagas, the
// projections) are imported by services/node, which assembles them, and
// by nothing else of ours but each other and the bench (whose pipeline
// runs measure some parts bare); cmd/torpor reaches them through the node.
func TestPartsBehindTheNode(t *testing.T) {
	parts := []string{"services/gateway", "sagas", "projections"}
	may := []string{"services/node", "bench", "sagas", "projections", "services/gateway"}
	seen := 0
	for pkg, imports := range ourPackages(t, ".Imports") {
		for _, imp := range imports {
			imp = strings.TrimPrefix(imp, module)
			if !slices.ContainsFunc(parts, func(p string) bool { return under(imp, p) }) {
				continue
			}
			seen++
			if !slices.ContainsFunc(may, func(m string) bool { return under(pkg, m) }) {
				t.Errorf("%s imports %s: only services/node assembles the parts", pkg, imp)
			}
		}
	}
	if seen == 0 {
		t.Fatal("nothing imports the parts: go list found too little")
	}
}

// TestBenchImportedByCmdAlone: the bench harness is imported by cmd/torpor
// and by nothing else of ours, not even a test: it starts the whole
// service, and a package that leaned on it would carry the bench (pgx,
// cockroach-go, the load generators) along.
func TestBenchImportedByCmdAlone(t *testing.T) {
	importers := 0
	for pkg, imports := range ourPackages(t, ".Imports", ".TestImports", ".XTestImports") {
		for _, imp := range imports {
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

// sqlDrivers may be imported only by sqlUsers: the bench's SQL upsert and
// the SQL view speak to the database; nothing else of ours, not even the
// binary's own wiring, should carry the drivers' API.
var (
	sqlDrivers = []string{"github.com/jackc/pgx", "github.com/cockroachdb/cockroach-go"}
	sqlUsers   = []string{"bench", "projections/sqlview"}
)

// TestSQLDriversStayInTheirPackages checks every package's imports, tests
// included, against sqlUsers.
func TestSQLDriversStayInTheirPackages(t *testing.T) {
	for pkg, imports := range ourPackages(t, ".Imports", ".TestImports", ".XTestImports") {
		for _, imp := range imports {
			for _, d := range sqlDrivers {
				if !strings.HasPrefix(imp, d) {
					continue
				}
				if !slices.ContainsFunc(sqlUsers, func(u string) bool { return under(pkg, u) }) {
					t.Errorf("%s imports %s: only %v may", pkg, imp, sqlUsers)
				}
			}
		}
	}
}
