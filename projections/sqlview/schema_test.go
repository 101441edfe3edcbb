package sqlview

import (
	"context"
	"fmt"
	"strings"
	"testing"

	migrations "github.com/torpor/torpor/deploy/sql"
	"github.com/torpor/torpor/events"
)

// TestMigrateTwice: opening the view applies every migration once and
// records it; opening it again changes nothing, rows included.
func TestMigrateTwice(t *testing.T) {
	d := newDB(t)
	ms, err := migrations.Migrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	v := d.view(t, DefaultName, nil)
	applyIn(t, v, envelopes(t, lifecycle(t)), 10)
	want := d.dump(t)
	schema := func() string {
		var s string
		err := d.admin.QueryRow(context.Background(),
			`SELECT string_agg(version::text || ' ' || name, ',' ORDER BY version) FROM torpor_schema`).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := schema()
	if n := strings.Count(before, ",") + 1; n != len(ms) {
		t.Errorf("torpor_schema %q: want %d versions", before, len(ms))
	}
	d.view(t, DefaultName, nil)
	d.view(t, "another", nil)
	if after := schema(); after != before {
		t.Errorf("torpor_schema %q after a second start, want %q", after, before)
	}
	got := d.dump(t)
	want = strings.Replace(want, "(sqlview,", "(another,0)\n(sqlview,", 1) // the new view's checkpoint row
	sameDump(t, got, want)
}

// TestNewerSchemaRefused: a database migrated by a newer build is refused
// with FAILED_PRECONDITION, naming both versions.
func TestNewerSchemaRefused(t *testing.T) {
	d := newDB(t)
	d.view(t, DefaultName, nil)
	if _, err := d.admin.Exec(context.Background(), `INSERT INTO torpor_schema (version, name) VALUES (99, '0099_future.sql')`); err != nil {
		t.Fatal(err)
	}
	_, err := New(context.Background(), d.pool(t, "newer", nil), Config{})
	if events.CodeOf(err) != events.CodeFailedPrecondition {
		t.Fatalf("New on a newer schema: %v, want FAILED_PRECONDITION", err)
	}
	ms, _ := migrations.Migrations(migrations.FS)
	for _, v := range []string{"99", fmt.Sprintf("this build's %d", len(ms))} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("error %q does not say %q", err, v)
		}
	}
}

// TestMalformedURL: a URL that does not parse is INVALID_ARGUMENT, before
// any connection.
func TestMalformedURL(t *testing.T) {
	for _, url := range []string{
		"postgres://torpor:torpor@127.0.0.1:notaport/torpor",
		"postgres://%zz",
		"host=127.0.0.1 sslmode=sideways",
	} {
		_, err := Open(context.Background(), url, Config{})
		if events.CodeOf(err) != events.CodeInvalidArgument {
			t.Errorf("Open(%q): %v, want INVALID_ARGUMENT", url, err)
		}
	}
}
