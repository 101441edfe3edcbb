package sqlview

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/torpor/torpor/internal/pgtest"
	"github.com/torpor/torpor/projections"
)

var (
	_ projections.Projection      = (*View)(nil)
	_ projections.BatchProjection = (*View)(nil)
	_ projections.Checkpointer    = (*View)(nil)
)

// db is one test's own schema in the test database.
type db struct {
	url    string
	schema string
	admin  *pgxpool.Pool // search_path: the schema
}

// newDB creates a fresh schema for t, dropped at cleanup.
func newDB(t *testing.T) *db {
	t.Helper()
	url := pgtest.URL(t)
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	d := &db{url: url, schema: "t_" + hex.EncodeToString(b)}
	ctx := context.Background()
	boot, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer boot.Close()
	if _, err := boot.Exec(ctx, "CREATE SCHEMA "+d.schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		p, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Errorf("connect for cleanup: %v", err)
			return
		}
		defer p.Close()
		if _, err := p.Exec(context.Background(), "DROP SCHEMA "+d.schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	d.admin = d.pool(t, "admin", nil)
	return d
}

// pool is a pool on d's schema; tweak, when not nil, edits its config.
func (d *db) pool(t *testing.T, app string, tweak func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		t.Fatalf("parse %s: %v", d.url, err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = d.schema
	cfg.ConnConfig.RuntimeParams["application_name"] = d.schema + "_" + app
	if tweak != nil {
		tweak(cfg)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// view opens the view named name on a pool of its own.
func (d *db) view(t *testing.T, name string, tweak func(*pgxpool.Config)) *View {
	t.Helper()
	v, err := New(context.Background(), d.pool(t, name, tweak), Config{Name: name})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

// dump is every row of the view's tables as PostgreSQL prints it, in key
// order: what "row for row" compares.
func (d *db) dump(t *testing.T) string {
	t.Helper()
	var sb strings.Builder
	for _, q := range []string{
		`SELECT s::text FROM torpor_sandboxes s ORDER BY id`,
		`SELECT h::text FROM torpor_history h ORDER BY seq`,
		`SELECT (view, seq, sandbox_id, type, error, data)::text FROM torpor_parked ORDER BY view, seq`,
		`SELECT c::text FROM torpor_checkpoints c ORDER BY view`,
	} {
		rs, err := d.admin.Query(context.Background(), q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		for rs.Next() {
			var s string
			if err := rs.Scan(&s); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			sb.WriteString(s + "\n")
		}
		if err := rs.Err(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		sb.WriteString("--\n")
	}
	return sb.String()
}

func (d *db) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := d.admin.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// sameDump fails t unless the dumps are equal, showing the first line that
// differs.
func sameDump(t *testing.T, got, want string) {
	t.Helper()
	if got == want {
		return
	}
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			t.Fatalf("tables differ at line %d (%d lines, want %d):\n got %s\nwant %s", i, len(g), len(w), gl, wl)
		}
	}
}

// eventually waits for cond, checking every few milliseconds, for up to 30 s.
func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// run runs r until the returned stop is called; stop waits for it and
// fails t if Run failed.
func run(t *testing.T, r *projections.Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// caughtUp waits until v's checkpoint is at last.
func caughtUp(t *testing.T, v *View, last uint64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s at seq %d", v.Name(), last), func() (bool, error) {
		cp, err := v.Checkpoint(context.Background())
		return cp >= last, err
	})
}
