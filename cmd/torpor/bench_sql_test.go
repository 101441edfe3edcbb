package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor/torpor/events"
)

// testDatabaseURL is the PostgreSQL the SQL tests run against, from
// TORPOR_TEST_DATABASE_URL. Without it the test fails under CI=true (.ci/run
// starts a PostgreSQL and sets the URL, so its absence there is a broken
// setup, not a reason to pass) and is skipped elsewhere, loudly.
func testDatabaseURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("TORPOR_TEST_DATABASE_URL")
	if url != "" {
		return url
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("TORPOR_TEST_DATABASE_URL is not set under CI=true: the SQL tests need a PostgreSQL (.ci/run starts one and sets it)")
	}
	t.Skip("SKIPPING: TORPOR_TEST_DATABASE_URL is not set, so the SQL tests did not run; .ci/run shows how to start a PostgreSQL and set it")
	return ""
}

// TestBenchSQLUpsert runs the SQL measurement briefly against a real
// PostgreSQL and checks what it left behind before dropping its tables:
// every committed transaction moved the checkpoint, the view holds one row
// per key touched, and nothing of the bench's remains afterwards.
func TestBenchSQLUpsert(t *testing.T) {
	url := testDatabaseURL(t)
	for _, tc := range []struct {
		name            string
		keys, rowsPerTx int
		wantRowsPerTx   int
	}{
		{"updates", 1200, 500, 500}, // batches wrap around the keys: rows are updated
		{"fewer keys than a batch", 100, 500, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r, err := benchSQLUpsert(ctx, url, tc.keys, tc.rowsPerTx, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%.0f rows/s, %d transactions of %d rows in %.2fs", r.RowsPerS, r.Batches, r.RowsPerTx, r.Seconds)
			if !(r.RowsPerS > 0) || r.Batches < 1 {
				t.Fatalf("%v rows/s over %d transactions, want a measured rate", r.RowsPerS, r.Batches)
			}
			if r.RowsPerTx != tc.wantRowsPerTx || r.Rows != r.Batches*r.RowsPerTx {
				t.Errorf("%d rows in %d transactions of %d, want transactions of %d", r.Rows, r.Batches, r.RowsPerTx, tc.wantRowsPerTx)
			}
			if r.Checkpoint != int64(r.Batches) {
				t.Errorf("checkpoint at %d after %d transactions, want them equal", r.Checkpoint, r.Batches)
			}
			if want := min(tc.keys, r.Rows); r.Distinct != want {
				t.Errorf("%d rows in the view after %d upserts over %d keys, want %d", r.Distinct, r.Rows, tc.keys, want)
			}
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var left int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name IN ($1, $2)`,
				sqlBenchView, sqlBenchCheckpoint).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Errorf("%d bench tables left after the run, want them dropped", left)
			}
		})
	}
}

// TestBenchSQLUpsertBadURL checks that a URL the bench cannot use is an
// error, returned well within the timeout, not a panic or a hang. It needs
// no database.
func TestBenchSQLUpsertBadURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		code events.Code
	}{
		{"postgres://torpor:torpor@127.0.0.1:1/torpor_test?sslmode=disable", events.CodeUnavailable}, // nothing listens
		{"postgres://%zz", events.CodeInvalidArgument},                                               // not a URL
		{"mysql://torpor@127.0.0.1/torpor_test", events.CodeInvalidArgument},                         // not PostgreSQL's
		{"postgres://x@127.0.0.1:5432/x?sslmode=bad", events.CodeInvalidArgument},                    // a bad parameter
	} {
		url := tc.url
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		began := time.Now()
		_, err := benchSQLUpsert(ctx, url, 10, 5, 100*time.Millisecond)
		cancel()
		if err == nil {
			t.Errorf("%s: no error", url)
			continue
		}
		if took := time.Since(began); took > 16*time.Second {
			t.Errorf("%s: the error took %s", url, took)
		}
		if got := events.CodeOf(err); got != tc.code {
			t.Errorf("%s: code %s, want %s (%v)", url, got, tc.code, err)
		}
		t.Logf("%s: %v", url, err)
	}
}

// TestBenchQuickReportSQL runs a shortened bench with --database-url and
// checks the figure reaches every place it is read from: raw.sql_upsert_eps
// in the JSON (top level and each mode), the table's line, and the note that
// the SQL rebuild row is still missing.
func TestBenchQuickReportSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the service under load for a few seconds")
	}
	url := testDatabaseURL(t)
	cfg := benchConfig{Sandboxes: 20, Concurrency: 4, Quick: true, Output: "json", Transport: "bus", Duration: 400 * time.Millisecond,
		Fsync: "interval", SkipGrowth: true, DatabaseURL: url}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	rep, err := runBench(context.Background(), cfg, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Raw struct {
			SQLUpsertEPS float64 `json:"sql_upsert_eps"`
		} `json:"raw"`
		Modes []struct {
			Raw struct {
				SQLUpsertEPS float64 `json:"sql_upsert_eps"`
			} `json:"raw"`
		} `json:"modes"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if !(doc.Raw.SQLUpsertEPS > 0) {
		t.Errorf("raw.sql_upsert_eps = %v, want a measured figure", doc.Raw.SQLUpsertEPS)
	}
	for _, m := range doc.Modes {
		if m.Raw.SQLUpsertEPS != doc.Raw.SQLUpsertEPS {
			t.Errorf("a mode's raw.sql_upsert_eps is %v, the report's %v: want the one figure everywhere", m.Raw.SQLUpsertEPS, doc.Raw.SQLUpsertEPS)
		}
	}
	var out strings.Builder
	rep.print(&out)
	for _, want := range []string{"raw batched SQL upsert (20 rows/tx + checkpoint): ", "note: the SQL rebuild row waits for the SQL view"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, out.String())
		}
	}
	for _, tg := range rep.Targets {
		if strings.Contains(strings.ToLower(tg.Name), "sql") {
			t.Errorf("target %q: there is no SQL view to hold to a target yet", tg.Name)
		}
	}
}
