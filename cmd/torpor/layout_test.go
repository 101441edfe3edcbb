package main

import (
	"os"
	"path"
	"strings"
	"testing"
)

// TestLayoutNamesEveryPackage: the README's Layout section names every
// package of the module, by its path or its last element, so the map of the
// tree does not drift from the tree.
func TestLayoutNamesEveryPackage(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	layout, _, _ = strings.Cut(layout, "\n## ")
	pkgs := ourPackages(t)
	for p := range pkgs {
		if !strings.Contains(layout, "`"+p+"`") && !strings.Contains(layout, "`"+path.Base(p)+"`") {
			t.Errorf("README's Layout section does not name package %s", p)
		}
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages, too few", len(pkgs))
	}
}
