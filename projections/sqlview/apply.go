package sqlview

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/projections"
)

// Apply folds env into its sandbox's row: ApplyBatch of one event.
func (v *View) Apply(ctx context.Context, env events.Envelope) error {
	return v.ApplyBatch(ctx, []events.Envelope{env})
}

// ApplyBatch folds envs (stream order) into their sandboxes' rows with the
// KV view's fold (events.View.Fold), adds them to the history and raises
// the checkpoint to the last of them, all in one transaction: after a
// crash the tables hold a whole batch or none of it.
//
// In the transaction it locks the view's checkpoint row, then reads the
// rows of the batch's sandboxes (FOR UPDATE); events at or below the
// checkpoint are skipped, and so is an event at or below its row's seq, so
// a redelivered batch changes nothing. A row is written only over one of a
// lower seq, a history row only where there is none (ON CONFLICT DO
// NOTHING). Another writer of the view waits on the checkpoint row, or
// fails to serialize and runs again (see tx) and then skips what this one
// applied.
//
// An event of a type this build does not know changes no row (the KV view
// skips it too) but is in the history. An event the view cannot apply is
// parked (torpor_parked, Parked) and the rest of the batch goes on: a known
// type whose data does not decode (the KV view skips it), a sandbox id no
// KV key can be (the KV view refuses those), text that PostgreSQL cannot
// store (a NUL character; such an event has no history row either).
func (v *View) ApplyBatch(ctx context.Context, envs []events.Envelope) error {
	if len(envs) == 0 {
		return nil
	}
	var ids []string
	seen := make(map[string]bool, len(envs))
	for _, env := range envs {
		if env.Seq == 0 {
			return fmt.Errorf("apply %s to %s: no stream sequence", env.Type, env.SandboxID)
		}
		if !seen[env.SandboxID] {
			seen[env.SandboxID] = true
			ids = append(ids, env.SandboxID)
		}
	}
	var p plan
	var parkedRows int64
	err := v.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		cp, cur, err := v.read(ctx, tx, ids)
		if err != nil {
			return err
		}
		p = fold(cp, cur, envs)
		if parkedRows, err = v.write(ctx, tx, p); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("apply seq %d to %d: %w", envs[0].Seq, envs[len(envs)-1].Seq, err)
	}
	v.applied.Add(uint64(p.applied))
	v.parked.Add(uint64(parkedRows))
	return nil
}

// read locks the checkpoint row and reads it, and the rows of ids, in one
// round trip.
func (v *View) read(ctx context.Context, tx pgx.Tx, ids []string) (uint64, map[string]events.View, error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT seq FROM torpor_checkpoints WHERE view = $1 FOR UPDATE`, v.cfg.Name)
	b.Queue(`SELECT `+columns+` FROM torpor_sandboxes WHERE id = ANY($1::TEXT[]) ORDER BY id FOR UPDATE`, cleanAll(ids))
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	var cp int64
	if err := br.QueryRow().Scan(&cp); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, nil, fmt.Errorf("read checkpoint: %w", err)
	}
	rs, err := br.Query()
	if err != nil {
		return 0, nil, fmt.Errorf("read rows: %w", err)
	}
	cur := make(map[string]events.View, len(ids))
	for rs.Next() {
		view, err := scanRow(rs)
		if err != nil {
			rs.Close()
			return 0, nil, fmt.Errorf("read rows: %w", err)
		}
		cur[view.ID] = view
	}
	if err := rs.Err(); err != nil {
		return 0, nil, fmt.Errorf("read rows: %w", err)
	}
	return uint64(cp), cur, br.Close()
}

// plan is what one batch writes.
type plan struct {
	rows    rows
	history history
	parked  parked
	top     uint64 // the batch's highest seq: the new checkpoint
	applied int    // events folded into a row
}

// fold folds the events of envs above cp into cur (the sandboxes' rows;
// absent: none yet) and says what to write. It is pure.
func fold(cp uint64, cur map[string]events.View, envs []events.Envelope) plan {
	var p plan
	var changed []string
	isChanged := map[string]bool{}
	for _, env := range envs {
		p.top = max(p.top, env.Seq)
		if env.Seq <= cp {
			continue
		}
		if err := storable(env); err != nil {
			p.parked.add(env, err)
			continue
		}
		p.history.add(env)
		if !events.Known(env.Type) {
			continue
		}
		if !viewID(env.SandboxID) {
			p.parked.add(env, fmt.Errorf("sandbox id %q: not one a view can hold", env.SandboxID))
			continue
		}
		view := cur[env.SandboxID]
		if env.Seq <= view.Seq {
			continue // the row holds it already
		}
		if !view.Fold(env) { // a known type above the row's seq: its data does not decode
			_, err := env.Decode()
			if err == nil {
				err = errors.New("the view's fold did not take it")
			}
			p.parked.add(env, err)
			continue
		}
		p.applied++
		cur[env.SandboxID] = view
		if !isChanged[env.SandboxID] {
			isChanged[env.SandboxID] = true
			changed = append(changed, env.SandboxID)
		}
	}
	for _, id := range changed {
		if err := p.rows.add(cur[id]); err != nil {
			// json.Marshal of a view's maps and structs does not fail;
			// if it ever did, the row keeps its last value.
			continue
		}
	}
	return p
}

// write sends the plan's statements and the checkpoint in one round trip,
// and returns how many events it parked anew.
func (v *View) write(ctx context.Context, tx pgx.Tx, p plan) (int64, error) {
	b := &pgx.Batch{}
	if len(p.rows.id) > 0 {
		b.Queue(upsertRows, p.rows.args()...)
	}
	if len(p.history.seq) > 0 {
		b.Queue(insertHistory, p.history.args()...)
	}
	if len(p.parked.seq) > 0 {
		b.Queue(insertParked, p.parked.args(v.cfg.Name)...)
	}
	b.Queue(`INSERT INTO torpor_checkpoints (view, seq) VALUES ($1, $2)
ON CONFLICT (view) DO UPDATE SET seq = excluded.seq WHERE torpor_checkpoints.seq < excluded.seq`, v.cfg.Name, int64(p.top))
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	var parked int64
	for _, what := range []struct {
		n    int
		name string
	}{{len(p.rows.id), "rows"}, {len(p.history.seq), "history"}, {len(p.parked.seq), "parked"}, {1, "checkpoint"}} {
		if what.n == 0 {
			continue
		}
		tag, err := br.Exec()
		if err != nil {
			return 0, fmt.Errorf("write %s: %w", what.name, err)
		}
		if what.name == "parked" {
			parked = tag.RowsAffected()
		}
	}
	return parked, br.Close()
}

// storable says why env cannot be stored in the tables, if it cannot:
// PostgreSQL's text refuses the NUL character, its JSONB the escape
// \u0000 and unpaired surrogates. (Strings decoded from JSON are valid
// UTF-8 already.)
func storable(env events.Envelope) error {
	for _, s := range []string{env.SandboxID, env.Type, env.Actor, env.CommandID, env.CorrelationID, env.CausationID, env.ID, string(env.Phase)} {
		if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
			return errors.New("envelope text holds a NUL or invalid UTF-8: not storable as TEXT")
		}
	}
	if !jsonbSafe(env.Data) {
		return errors.New("data holds \\u0000 or an unpaired surrogate: not storable as JSONB")
	}
	return nil
}

// jsonbSafe reports whether the JSON b holds none of the escapes JSONB
// refuses: \u0000 and a surrogate escape that is not a high one followed by
// a low one.
func jsonbSafe(b []byte) bool {
	hex := func(i int) (int, bool) {
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		n := 0
		for _, c := range b[i+2 : i+6] {
			switch {
			case c >= '0' && c <= '9':
				n = n*16 + int(c-'0')
			case c >= 'a' && c <= 'f':
				n = n*16 + int(c-'a'+10)
			case c >= 'A' && c <= 'F':
				n = n*16 + int(c-'A'+10)
			default:
				return 0, false
			}
		}
		return n, true
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		n, ok := hex(i)
		if !ok {
			i++ // another escape: skip the escaped character
			continue
		}
		switch {
		case n == 0, n >= 0xDC00 && n <= 0xDFFF:
			return false
		case n >= 0xD800 && n <= 0xDBFF:
			lo, ok := hex(i + 6)
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return false
			}
			i += 6
		}
		i += 5
	}
	return true
}

// clean makes s storable as TEXT, for the parked table's record of what
// could not be stored.
func clean(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func cleanAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = clean(s)
	}
	return out
}

// viewID reports whether id can be a sandbox's row: the rule of the KV view's
// keys (a NATS KV key without dots), so that both views hold the same
// sandboxes.
func viewID(id string) bool { return projections.ViewID(id) }
