package sqlview

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/torpor/torpor/projections"
)

// midBatch calls hit when the view sends the writes of its nth batch, with
// the connection they go on: the transaction has read its rows and not
// written them yet.
type midBatch struct {
	n    int64
	seen atomic.Int64
	hit  func(conn *pgx.Conn)
}

func (m *midBatch) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		if strings.HasPrefix(q.SQL, "INSERT INTO torpor_history") && m.seen.Add(1) == m.n {
			m.hit(conn)
		}
	}
	return ctx
}
func (m *midBatch) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (m *midBatch) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (m *midBatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (m *midBatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func tracing(m *midBatch) func(*pgxpool.Config) {
	return func(c *pgxpool.Config) { c.ConnConfig.Tracer = m }
}

// TestKillMidBatch: the runner stopped in the middle of a batch leaves the
// tables as a whole number of batches left them; a restarted runner, whose
// database connection is then cut in the middle of another batch, finishes
// with the tables a fresh rebuild gives, row for row.
func TestKillMidBatch(t *testing.T) {
	d := newDB(t)
	envs := envelopes(t, append(lifecycle(t), randomScript(t, 11, 30, 600)...))
	store := logOf(t, envs)
	last := envs[len(envs)-1].Seq
	cfg := projections.Config{BatchSize: 40}

	// Stop the runner while its fourth batch is in flight.
	ctx, cancel := context.WithCancel(context.Background())
	kill := &midBatch{n: 4, hit: func(*pgx.Conn) { cancel() }}
	v := d.view(t, DefaultName, tracing(kill))
	r, err := projections.NewRunner(store, v, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if kill.seen.Load() < 4 {
		t.Fatalf("the runner stopped before its fourth batch (%d)", kill.seen.Load())
	}
	cp, err := v.Checkpoint(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cp == 0 || cp >= last {
		t.Fatalf("checkpoint %d after the kill, want some of %d", cp, last)
	}
	upTo := newDB(t)
	applyIn(t, upTo.view(t, DefaultName, nil), envs[:cp], int(cp))
	sameDump(t, d.dump(t), upTo.dump(t))

	// Start again; cut the connection under the third batch.
	var cut *pgx.Conn
	drop := &midBatch{n: 3, hit: func(conn *pgx.Conn) {
		cut = conn
		if _, err := d.admin.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, conn.PgConn().PID()); err != nil {
			t.Errorf("terminate: %v", err)
		}
	}}
	v2 := d.view(t, DefaultName, tracing(drop))
	r2, err := projections.NewRunner(store, v2, projections.Config{BatchSize: 40, MinBackoff: 10e6, MaxBackoff: 50e6})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r2)
	caughtUp(t, v2, last)
	stop()
	if cut == nil {
		t.Fatal("no connection was cut")
	}

	fresh := newDB(t)
	fr, err := projections.NewRunner(store, fresh.view(t, DefaultName, nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopFresh := run(t, fr)
	caughtUp(t, fresh.view(t, DefaultName, nil), last)
	stopFresh()
	sameDump(t, d.dump(t), fresh.dump(t))
}
