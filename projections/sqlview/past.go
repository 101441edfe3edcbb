package sqlview

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Views of the past expire. A rebuild until a sequence keeps its tables
// (PastTables) for audit and records when it made them in torpor_past, in
// the transaction that names them; ReapPast, which serve runs on the
// schedule of its other reaping (--replay-ttl), drops the ones made longer
// ago than the TTL. Without it each replay --until would keep two tables
// for ever.

// ReapPast drops the tables of the past made more than ttl before now, with
// their records, and returns the tables dropped. A table of the past with
// no record (made by a build that kept none, or whose record was lost) is
// recorded as made now, so it goes ttl later; a record whose tables are
// gone is removed.
func (v *View) ReapPast(ctx context.Context, ttl time.Duration, now time.Time) ([]string, error) {
	seqs, err := v.pastSeqs(ctx)
	if err != nil {
		return nil, fmt.Errorf("reap the past: %w", err)
	}
	if len(seqs) > 0 {
		b := &pgx.Batch{}
		for _, seq := range seqs {
			b.Queue(`INSERT INTO torpor_past (seq, made_at) VALUES ($1, $2) ON CONFLICT (seq) DO NOTHING`, int64(seq), now.UTC())
		}
		if err := v.pool.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("reap the past: record: %w", err)
		}
	}
	rs, err := v.pool.Query(ctx, `SELECT seq FROM torpor_past WHERE made_at < $1 ORDER BY seq`, now.Add(-ttl).UTC())
	if err != nil {
		return nil, fmt.Errorf("reap the past: %w", err)
	}
	expired, err := pgx.CollectRows(rs, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("reap the past: %w", err)
	}
	rs, err = v.pool.Query(ctx, `SELECT seq FROM torpor_past ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("reap the past: %w", err)
	}
	recorded, err := pgx.CollectRows(rs, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("reap the past: %w", err)
	}
	for _, seq := range recorded {
		if !slices.Contains(seqs, uint64(seq)) && !slices.Contains(expired, seq) {
			expired = append(expired, seq) // its tables are gone: only the record goes
		}
	}
	var dropped []string
	for _, seq := range expired {
		s, h := PastTables(uint64(seq))
		err := v.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			for _, q := range []string{`DROP TABLE IF EXISTS ` + ident(s), `DROP TABLE IF EXISTS ` + ident(h)} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `DELETE FROM torpor_past WHERE seq = $1`, seq)
			return err
		})
		if err != nil {
			return dropped, fmt.Errorf("reap the past at seq %d: %w", seq, err)
		}
		if slices.Contains(seqs, uint64(seq)) {
			dropped = append(dropped, s, h)
		}
	}
	return dropped, nil
}

// pastSeqs are the sequences of the tables of the past in the view's schema.
func (v *View) pastSeqs(ctx context.Context) ([]uint64, error) {
	rs, err := v.pool.Query(ctx, `SELECT table_name FROM information_schema.tables
WHERE table_schema = current_schema() AND (table_name LIKE 'torpor\_sandboxes\_at\_%' OR table_name LIKE 'torpor\_history\_at\_%')`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, name := range names {
		_, n, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(name, "torpor_sandboxes"), "torpor_history"), "_at_")
		seq, err := strconv.ParseUint(n, 10, 64)
		if err != nil || seq == 0 {
			continue // not one of ours
		}
		if !slices.Contains(seqs, seq) {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}
