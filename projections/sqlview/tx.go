package sqlview

import (
	"context"
	"errors"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	crdbpgx "github.com/cockroachdb/cockroach-go/v2/crdb/crdbpgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// inTxRetries is how often crdbpgx.ExecuteTx retries a transaction inside
// itself (ROLLBACK TO SAVEPOINT cockroach_restart) before tx starts a new
// one. On CockroachDB that retry moves the transaction to a new timestamp
// and usually succeeds; on PostgreSQL the transaction keeps its snapshot, so
// only a new transaction can succeed, and few in-place retries are wasted.
const inTxRetries = 2

// tx runs fn in a SERIALIZABLE transaction through crdbpgx.ExecuteTx, and
// runs it again in a new transaction, up to cfg.TxAttempts times, when
// the database undid it for a serialization failure or a deadlock.
//
// ExecuteTx commits with RELEASE SAVEPOINT, which is the commit on
// CockroachDB, and ignores the error of the COMMIT that follows. On
// PostgreSQL that COMMIT is the real one, and where a serializable
// transaction fails (40001) or a connection breaks; tx sees that error
// through the transaction it hands ExecuteTx and returns it. A broken
// commit leaves the outcome unknown: the caller applies the batch again,
// which is idempotent.
func (v *View) tx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return v.txAt(ctx, pgx.Serializable, fn)
}

// txAt is tx at isolation level iso.
func (v *View) txAt(ctx context.Context, iso pgx.TxIsoLevel, fn func(ctx context.Context, tx pgx.Tx) error) error {
	wait := 5 * time.Millisecond
	for attempt := 1; ; attempt++ {
		b := &beginner{pool: v.pool}
		calls := 0
		err := crdbpgx.ExecuteTx(crdb.WithMaxRetries(ctx, inTxRetries), b, pgx.TxOptions{IsoLevel: iso},
			func(tx pgx.Tx) error {
				if calls++; calls > 1 {
					v.retries.Add(1)
				}
				return fn(ctx, tx)
			})
		if err == nil {
			err = b.commitErr
		}
		if err == nil || !retryable(err) || attempt >= v.cfg.TxAttempts {
			return err
		}
		v.retries.Add(1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// retryable reports whether err undid a transaction that may succeed when
// run again: a serialization failure, CockroachDB's retry code, a deadlock.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "40001", "CR000", "40P01":
		return true
	}
	return false
}

// beginner begins the transactions of ExecuteTx from pool and keeps the
// error of their COMMIT, which ExecuteTx drops.
type beginner struct {
	pool interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}
	commitErr error
}

func (b *beginner) Begin(ctx context.Context) (pgx.Tx, error) {
	return b.BeginTx(ctx, pgx.TxOptions{})
}

func (b *beginner) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := b.pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &keptTx{Tx: tx, b: b}, nil
}

// keptTx is a transaction whose Commit error is kept in b.
type keptTx struct {
	pgx.Tx
	b *beginner
}

func (t *keptTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.b.commitErr = err
	return err
}

var _ crdbpgx.Conn = (*beginner)(nil)
