package torpor_test

import (
	"bytes"
	"flag"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite api.txt, the listing of the exported API")

// The exported API only grows: every line of api.txt (the committed
// listing) is still produced from the source, and every line produced is
// in api.txt (a new one is added with -update, in the change that adds it).
func TestExportedAPI(t *testing.T) {
	got, err := exportedAPI(".")
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("api.txt", []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile("api.txt")
	if err != nil {
		t.Fatalf("%v: run go test ./sdk/go -run TestExportedAPI -update", err)
	}
	var want []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			want = append(want, l)
		}
	}
	for _, l := range want {
		if !slices.Contains(got, l) {
			t.Errorf("the SDK's API only grows: removed or changed: %s", l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			t.Errorf("exported API not in api.txt: %s\n\trun go test ./sdk/go -run TestExportedAPI -update (and commit api.txt with it)", l)
		}
	}
}

// The listing is made from the source: a method added, removed or changed
// shows as a line of its own.
func TestExportedAPIListing(t *testing.T) {
	dir := t.TempDir()
	src := `package p

// T is a type.
type T struct {
	A int
	b int
	C struct{ X string }
}

type I interface {
	M(x int) error
}

type Alias = T

const K = "k"

var V = 1

func New(a string) *T { return nil }

func (t *T) M(ctx int, s ...string) (int, error) { return 0, nil }
func (T) N() {}
func (t *T) hidden() {}
func hidden() {}
`
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := exportedAPI(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`const K = "k"`,
		`field T.A int`,
		`field T.C struct{ X string }`,
		`func New(a string) *T`,
		`method (*T) M(ctx int, s ...string) (int, error)`,
		`method (T) N()`,
		`type Alias = T`,
		`type I interface { M(x int) error }`,
		`type T struct`,
		`var V = 1`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("listing:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// exportedAPI lists the exported API of the package in dir (its files
// other than tests), one sorted line per const, var, func, type, method
// and struct field, each with its signature.
func exportedAPI(dir string) ([]string, error) {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	pkg, err := doc.NewFromFiles(fset, files, "p")
	if err != nil {
		return nil, err
	}
	var lines []string
	show := func(n any) string {
		var b bytes.Buffer
		_ = printer.Fprint(&b, fset, n)
		return strings.Join(strings.Fields(b.String()), " ")
	}
	values := func(kind string, vs []*doc.Value) {
		for _, v := range vs {
			for _, spec := range v.Decl.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !name.IsExported() {
						continue
					}
					l := kind + " " + name.Name
					if vs.Type != nil {
						l += " " + show(vs.Type)
					}
					if i < len(vs.Values) {
						l += " = " + show(vs.Values[i])
					}
					lines = append(lines, l)
				}
			}
		}
	}
	funcs := func(fs []*doc.Func) {
		for _, f := range fs {
			d := *f.Decl
			d.Doc, d.Body = nil, nil
			if d.Recv == nil {
				lines = append(lines, show(&d))
				continue
			}
			// The receiver's name is no part of the API.
			recv := show(d.Recv.List[0].Type)
			d.Recv = nil
			lines = append(lines, "method ("+recv+") "+strings.TrimPrefix(show(&d), "func "))
		}
	}
	values("const", pkg.Consts)
	values("var", pkg.Vars)
	funcs(pkg.Funcs)
	for _, typ := range pkg.Types {
		values("const", typ.Consts)
		values("var", typ.Vars)
		funcs(typ.Funcs)
		funcs(typ.Methods)
		for _, spec := range typ.Decl.Specs {
			ts := spec.(*ast.TypeSpec)
			if !ts.Name.IsExported() {
				continue
			}
			switch t := ts.Type.(type) {
			case *ast.StructType:
				lines = append(lines, "type "+ts.Name.Name+" struct")
				for _, f := range t.Fields.List {
					for _, name := range f.Names {
						if name.IsExported() {
							lines = append(lines, "field "+ts.Name.Name+"."+name.Name+" "+show(f.Type))
						}
					}
					if len(f.Names) == 0 { // embedded
						lines = append(lines, "field "+ts.Name.Name+" embeds "+show(f.Type))
					}
				}
			default:
				// An interface is one line with its whole method set: a
				// method added to it breaks implementations outside, so
				// it shows as a change, not as a line added.
				assign := " "
				if ts.Assign.IsValid() {
					assign = " = "
				}
				lines = append(lines, "type "+ts.Name.Name+assign+show(ts.Type))
			}
		}
	}
	slices.Sort(lines)
	return lines, nil
}
