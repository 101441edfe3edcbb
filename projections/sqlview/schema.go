package sqlview

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	migrations "github.com/torpor/torpor/deploy/sql"
	"github.com/torpor/torpor/events"
)

// migrateAttempts bounds the runs of migrate: two processes starting on a
// fresh database at once may both create a table, and PostgreSQL refuses
// the second CREATE TABLE IF NOT EXISTS with a unique violation.
const migrateAttempts = 3

// migrate brings the schema to the newest of deploy/sql's migrations. The versions
// applied are rows of torpor_schema; each migration runs in one transaction
// with its row, and is idempotent itself, so a second run changes nothing.
func (v *View) migrate(ctx context.Context) error {
	ms, err := migrations.Migrations(migrations.FS)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err = v.migrateOnce(ctx, ms)
		var pe *pgconn.PgError
		if err == nil || attempt >= migrateAttempts || !errors.As(err, &pe) ||
			(pe.Code != "23505" && pe.Code != "42P07" && pe.Code != "42710") {
			return err
		}
	}
}

func (v *View) migrateOnce(ctx context.Context, ms []migrations.Migration) error {
	_, err := v.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS torpor_schema (
  version INT8 PRIMARY KEY,
  name TEXT NOT NULL,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	var have int64
	if err := v.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM torpor_schema`).Scan(&have); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if want := int64(len(ms)); have > want {
		return events.Errorf(events.CodeFailedPrecondition,
			"database schema version %d is newer than this build's %d: run a newer torpor", have, want)
	}
	for _, m := range ms[have:] {
		err := v.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO torpor_schema (version, name) VALUES ($1, $2) ON CONFLICT (version) DO NOTHING`,
				m.Version, m.Name)
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %s: %w", m.Name, err)
		}
	}
	_, err = v.pool.Exec(ctx, `INSERT INTO torpor_checkpoints (view, seq) VALUES ($1, 0) ON CONFLICT (view) DO NOTHING`, v.cfg.Name)
	if err != nil {
		return fmt.Errorf("checkpoint row: %w", err)
	}
	return nil
}
