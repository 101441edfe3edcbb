// Package sql holds the SQL view's schema migrations (files NNNN_name.sql,
// applied in the order of their numbers) embedded in the binary, so that the
// schema ships with the code that reads and writes it. Nothing here talks to
// a database: projections/sqlview applies them.
package sql

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

//go:embed *.sql
var files embed.FS

// FS is the migration files.
var FS fs.FS = files

// Migration is one schema step.
type Migration struct {
	Version int    // from the file name: 0001_init.sql is 1
	Name    string // the file name
	SQL     string
}

// Migrations parses the migration files of fsys in version order. Versions
// must run 1, 2, 3 … without gaps or repeats: the database records the
// highest one applied and takes every later one in turn.
func Migrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	var ms []Migration
	for _, name := range names {
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: want NNNN_name.sql", name)
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: version %d, want %d (no gaps or repeats)", m.Name, m.Version, i+1)
		}
	}
	return ms, nil
}
