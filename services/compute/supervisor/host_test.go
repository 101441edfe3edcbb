package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLastLines(t *testing.T) {
	long := strings.Repeat("x", 70<<10) // a line longer than a block
	many := strings.Repeat("line\n", 40000)
	for _, tc := range []struct {
		name, file string
		n          int
		want       string
	}{
		{"empty", "", 3, ""},
		{"fewer lines than asked", "a\nb\n", 5, "a\nb\n"},
		{"the last ones", "a\nb\nc\nd\n", 2, "c\nd\n"},
		{"no newline at the end", "a\nb\nc", 2, "b\nc\n"},
		{"all for n below 1", "a\nb\n", 0, "a\nb\n"},
		{"blank lines count", "a\n\n\nb\n", 3, "\n\nb\n"},
		{"a line longer than a block", "a\n" + long + "\nb\n", 2, long + "\nb\n"},
		{"many blocks back", "first\n" + many, 40000, many},
		{"across a block's edge", many + "end\n", 3, "line\nline\nend\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "out")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := LastLines(path, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got %d bytes %.40q…, want %d bytes %.40q…", len(got), got, len(tc.want), tc.want)
			}
		})
	}
	if got, err := LastLines(filepath.Join(t.TempDir(), "none"), 3); err != nil || got != nil {
		t.Fatalf("a missing file: %q, %v", got, err)
	}
}
