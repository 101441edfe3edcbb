package drivertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Main is the TestMain of a driver's tests whose supervisors run the torpor
// binary (the test binary has no `supervise` verb): it builds the binary
// into a temporary directory, sets *bin to its path, runs m, removes the
// directory and exits with m's code.
func Main(m *testing.M, bin *string) {
	dir, err := os.MkdirTemp("", "torpor-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = filepath.Join(dir, "torpor")
	if out, err := exec.Command("go", "build", "-o", *bin, "github.com/torpor/torpor/cmd/torpor").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
