package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/pgtest"
)

// TestSQLUpsert runs the SQL measurement briefly against a real
// PostgreSQL and checks what it left behind before dropping its tables:
// every committed transaction moved the checkpoint, the view holds one row
// per key touched, and nothing of the bench's remains afterwards.
func TestSQLUpsert(t *testing.T) {
	url := pgtest.URL(t)
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
			r, err := measureSQLUpsert(ctx, url, tc.keys, tc.rowsPerTx, 300*time.Millisecond)
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

// TestSQLUpsertBadURL checks that a URL the bench cannot use is an
// error, returned well within the timeout, not a panic or a hang. It needs
// no database.
func TestSQLUpsertBadURL(t *testing.T) {
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
		_, err := measureSQLUpsert(ctx, url, 10, 5, 100*time.Millisecond)
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
