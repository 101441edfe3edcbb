package sql

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestShippedMigrations(t *testing.T) {
	ms, err := Migrations(FS)
	if err != nil {
		t.Fatalf("Migrations: %v", err)
	}
	if len(ms) == 0 || ms[0].Name != "0001_init.sql" {
		t.Fatalf("migrations %v: want 0001_init.sql first", ms)
	}
	for _, m := range ms {
		// UPSERT is CockroachDB's alone; the view's SQL runs on PostgreSQL too.
		if strings.Contains(strings.ToUpper(m.SQL), "UPSERT") {
			t.Errorf("%s says UPSERT: not PostgreSQL", m.Name)
		}
	}
}

func TestMigrationsRefuse(t *testing.T) {
	cases := []struct {
		name  string
		files fstest.MapFS
	}{
		{"a gap", fstest.MapFS{"0001_a.sql": {}, "0003_c.sql": {}}},
		{"a repeat", fstest.MapFS{"0001_a.sql": {}, "0001_b.sql": {}}},
		{"no number", fstest.MapFS{"init.sql": {}}},
		{"not from one", fstest.MapFS{"0002_b.sql": {}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if ms, err := Migrations(c.files); err == nil {
				t.Errorf("Migrations = %v, nil; want an error", ms)
			}
		})
	}
}
