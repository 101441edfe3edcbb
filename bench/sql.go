package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	crdbpgx "github.com/cockroachdb/cockroach-go/v2/crdb/crdbpgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/torpor/torpor/events"
)

// The bench's throwaway tables. Their prefix keeps them apart from anything
// else in the database; fixed names let a run drop what a crashed run left.
const (
	sqlBenchView       = "torpor_bench_phases"
	sqlBenchCheckpoint = "torpor_bench_checkpoint"
	// sqlBenchRowsPerTx is the rows each transaction upserts, at most: a
	// projection that folds a batch of events writes each sandbox once, so
	// a batch never holds more rows than there are sandboxes.
	sqlBenchRowsPerTx = 500
)

// sqlUpsertResult is the raw SQL denominator: how many view rows per second
// the database takes when one writer upserts them in batches, each batch in a
// transaction with the checkpoint, the way a SQL projection writes.
type sqlUpsertResult struct {
	RowsPerS  float64
	RowsPerTx int // rows per transaction, after the cap at the key space
	Rows      int // rows upserted
	Batches   int // transactions committed
	Seconds   float64
	// Checkpoint is the checkpoint's position read back after the run; each
	// transaction sets it to its own count, so it equals Batches when every
	// committed transaction wrote it once.
	Checkpoint int64
	// Distinct is the view table's row count after the run.
	Distinct int
}

// sqlUpsert is the statement each transaction runs: the batch as arrays,
// unnested into rows, upserted with INSERT … ON CONFLICT, which PostgreSQL
// and CockroachDB both accept. A row only moves forward (last_seq), as a
// projection's must when an event is delivered twice.
//
// It is the fastest of the three shapes tried on PostgreSQL 15 (2 cores,
// 500 rows/tx, each sent with the checkpoint in one round trip): about 72k
// rows/s, against 50k for one multi-row VALUES of 3000 parameters and 40k for
// a pgx.Batch of one upsert per row. The server plans and executes one
// statement instead of 500, and six array parameters are cheaper to bind
// than 3000 scalars. The body travels as text and is cast to JSONB in the
// statement because older CockroachDB releases have no arrays of JSONB.
const sqlUpsert = `INSERT INTO ` + sqlBenchView + ` (id, phase, generation, last_seq, updated_at, body)
SELECT id, phase, generation, last_seq, updated_at, body::JSONB
FROM unnest($1::TEXT[], $2::TEXT[], $3::INT8[], $4::INT8[], $5::TIMESTAMPTZ[], $6::TEXT[])
  AS r (id, phase, generation, last_seq, updated_at, body)
ON CONFLICT (id) DO UPDATE SET phase = excluded.phase, generation = excluded.generation,
  last_seq = excluded.last_seq, updated_at = excluded.updated_at, body = excluded.body
WHERE ` + sqlBenchView + `.last_seq < excluded.last_seq`

const sqlCheckpoint = `INSERT INTO ` + sqlBenchCheckpoint + ` (name, position) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET position = excluded.position`

// measureSQLUpsert measures batched upserts of phase-view rows into the
// database at url for d: one writer, each transaction upserting up to
// rowsPerTx rows over a key space of keys sandboxes (so after the first pass
// rows are updated, not inserted) and the checkpoint row, run through
// crdbpgx.ExecuteTx as the SQL view will. It creates its tables first and
// drops them at the end, also on failure.
func measureSQLUpsert(ctx context.Context, url string, keys, rowsPerTx int, d time.Duration) (sqlUpsertResult, error) {
	r := sqlUpsertResult{RowsPerTx: min(rowsPerTx, keys)}
	if r.RowsPerTx < 1 {
		return r, errors.New("sql upsert: want at least one key and one row per transaction")
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return r, events.Errorf(events.CodeInvalidArgument, "--database-url: %w", err)
	}
	pcfg.MaxConns = 1 // one writer; set-up and clean-up run before and after it
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return r, events.Errorf(events.CodeInvalidArgument, "--database-url: %w", err)
	}
	defer pool.Close()
	// A URL without connect_timeout waits for the dial as long as the
	// kernel does; an unreachable host should fail the bench quickly.
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = pool.Ping(pingCtx)
	cancel()
	if err != nil {
		return r, events.Errorf(events.CodeUnavailable, "sql upsert: connect: %w", err)
	}
	drop := func(ctx context.Context) error {
		for _, t := range []string{sqlBenchView, sqlBenchCheckpoint} {
			if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
				return fmt.Errorf("sql upsert: drop %s: %w", t, err)
			}
		}
		return nil
	}
	if err := drop(ctx); err != nil {
		return r, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		_ = drop(ctx)
	}()
	for _, ddl := range []string{
		`CREATE TABLE ` + sqlBenchView + ` (id TEXT PRIMARY KEY, phase TEXT NOT NULL, generation BIGINT NOT NULL,
			last_seq BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL, body JSONB NOT NULL)`,
		`CREATE TABLE ` + sqlBenchCheckpoint + ` (name TEXT PRIMARY KEY, position BIGINT NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return r, fmt.Errorf("sql upsert: create: %w", err)
		}
	}

	// A body about the size of a view document; its content does not
	// matter to the database, its size does.
	ids := make([]string, keys)
	bodies := make([]string, keys)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-%08d", i)
		bodies[i] = `{"id":"` + ids[i] + `","name":"` + ids[i] + `","driver":"sim","node":"local","labels":{"bench":"sql"},` +
			`"restore":{"ref":"","consumed":false},"last_outcome":"restored","exit_code":null,"reason":""}`
	}
	n := r.RowsPerTx
	var (
		id, phase, body = make([]string, n), make([]string, n), make([]string, n)
		gen, seq        = make([]int64, n), make([]int64, n)
		at              = make([]time.Time, n)
	)
	start := time.Now()
	for time.Since(start) < d {
		now := time.Now()
		for j := range n {
			row := r.Rows + j
			k := row % keys
			pass := row / keys
			id[j], body[j], at[j] = ids[k], bodies[k], now
			phase[j] = "ready"
			if pass%2 == 1 {
				phase[j] = "suspended"
			}
			gen[j], seq[j] = int64(pass/2+1), int64(row+1)
		}
		pos := int64(r.Batches + 1)
		err := crdbpgx.ExecuteTx(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(sqlUpsert, id, phase, gen, seq, at, body)
			b.Queue(sqlCheckpoint, "phases", pos)
			return tx.SendBatch(ctx, b).Close()
		})
		if err != nil {
			return r, fmt.Errorf("sql upsert: batch %d: %w", pos, err)
		}
		r.Rows += n
		r.Batches++
	}
	r.Seconds = time.Since(start).Seconds()
	r.RowsPerS = float64(r.Rows) / r.Seconds

	err = pool.QueryRow(ctx, "SELECT position FROM "+sqlBenchCheckpoint+" WHERE name = 'phases'").Scan(&r.Checkpoint)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("sql upsert: read the checkpoint: %w", err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sqlBenchView).Scan(&r.Distinct); err != nil {
		return r, fmt.Errorf("sql upsert: count the rows: %w", err)
	}
	return r, nil
}
