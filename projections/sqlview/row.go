package sqlview

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor/torpor/events"
)

// columns are torpor_sandboxes' columns in the order scanRow reads them.
const columns = `id, name, phase, generation, driver, node, labels, restore, last_outcome, exit_code, reason,
  updated_at, updated_at_nanos, seq, forwards, phase_since, phase_since_nanos, expiry,
  last_active_at, last_active_at_nanos,
  wake_on_traffic,
  idle`

// scanRow reads one row of columns into a view: labels, restore and
// forwards from their JSON, updated_at and phase_since with their
// nanoseconds, in UTC (a NULL phase_since is the zero time), and
// last_active_at likewise.
func scanRow(r pgx.Row) (events.View, error) {
	var (
		v                         events.View
		phase                     string
		labels, restore, forwards []byte
		exit                      *int64
		at                        time.Time
		nanos, sinceNanos         int32
		since                     *time.Time
		seq                       int64
		exp                       []byte
		active                    *time.Time
		activeNanos               int32
		idle                      []byte
	)
	err := r.Scan(&v.ID, &v.Name, &phase, &v.Generation, &v.Driver, &v.Node, &labels, &restore,
		&v.LastOutcome, &exit, &v.Reason, &at, &nanos, &seq, &forwards, &since, &sinceNanos, &exp,
		&active, &activeNanos,
		&v.WakeOnTraffic,
		&idle)
	if err != nil {
		return events.View{}, err
	}
	v.Phase, v.Seq = events.Phase(phase), uint64(seq)
	v.UpdatedAt = at.UTC().Add(time.Duration(nanos))
	if since != nil {
		v.PhaseSince = since.UTC().Add(time.Duration(sinceNanos))
	}
	if active != nil {
		v.LastActiveAt = active.UTC().Add(time.Duration(activeNanos))
	}
	if exit != nil {
		code := int(*exit)
		v.ExitCode = &code
	}
	for _, c := range []struct {
		name string
		b    []byte
		to   any
	}{{"labels", labels, &v.Labels}, {"restore", restore, &v.Restore}, {"forwards", forwards, &v.Forwards}} {
		if c.b == nil {
			continue
		}
		if err := json.Unmarshal(c.b, c.to); err != nil {
			return events.View{}, fmt.Errorf("row %s: %s: %w", v.ID, c.name, err)
		}
	}
	if exp != nil {
		var x expiry
		if err := json.Unmarshal(exp, &x); err != nil {
			return events.View{}, fmt.Errorf("row %s: expiry: %w", v.ID, err)
		}
		v.ExpiresAt, v.OnExpiry, v.RetainFor = x.ExpiresAt, x.OnExpiry, x.RetainFor
		v.TTLPausesWhileSuspended, v.ExpiryPaused = x.TTLPausesWhileSuspended, x.ExpiryPaused
	}
	if idle != nil {
		if err := json.Unmarshal(idle, &v.Idle); err != nil {
			return events.View{}, fmt.Errorf("row %s: idle: %w", v.ID, err)
		}
	}
	return v, nil
}

// expiry is the column expiry: the view's expiry policies (issue 27).
type expiry struct {
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	OnExpiry  string    `json:"on_expiry,omitempty"`
	RetainFor string    `json:"retain_for,omitempty"`
	// TTLPausesWhileSuspended and ExpiryPaused: the view's (ExpiresAt is
	// then the effective expiry).
	TTLPausesWhileSuspended bool `json:"ttl_pauses_while_suspended,omitempty"`
	ExpiryPaused            bool `json:"expiry_paused,omitempty"`
}

// rows are views as the columns of one INSERT: one array per column (see
// upsertRows). A nil map or slice is NULL.
type rows struct {
	id, name, phase, driver, node, outcome, reason []string
	labels, forwards                               []*string
	restore                                        []string
	generation, seq                                []int64
	exit                                           []*int64
	at                                             []time.Time
	nanos                                          []int32
	since                                          []*time.Time // nil: no phase_since
	sinceNanos                                     []int32
	expiry                                         []*string    // nil: none
	active                                         []*time.Time // nil: no last_active_at
	activeNanos                                    []int32
	wake                                           []bool
	idle                                           []*string // nil: none
}

func (r *rows) add(v events.View) error {
	r.id, r.name, r.phase = append(r.id, v.ID), append(r.name, v.Name), append(r.phase, string(v.Phase))
	r.driver, r.node = append(r.driver, v.Driver), append(r.node, v.Node)
	r.outcome, r.reason = append(r.outcome, v.LastOutcome), append(r.reason, v.Reason)
	r.generation, r.seq = append(r.generation, v.Generation), append(r.seq, int64(v.Seq))
	var exit *int64
	if v.ExitCode != nil {
		c := int64(*v.ExitCode)
		exit = &c
	}
	r.exit = append(r.exit, exit)
	// PostgreSQL keeps microseconds; the rest goes in its own column.
	r.at, r.nanos = append(r.at, v.UpdatedAt.Truncate(time.Microsecond)), append(r.nanos, int32(v.UpdatedAt.Nanosecond()%1000))
	var since *time.Time
	if !v.PhaseSince.IsZero() {
		t := v.PhaseSince.Truncate(time.Microsecond)
		since = &t
	}
	r.since, r.sinceNanos = append(r.since, since), append(r.sinceNanos, int32(v.PhaseSince.Nanosecond()%1000))
	var active *time.Time
	if !v.LastActiveAt.IsZero() {
		t := v.LastActiveAt.Truncate(time.Microsecond)
		active = &t
	}
	r.active, r.activeNanos = append(r.active, active), append(r.activeNanos, int32(v.LastActiveAt.Nanosecond()%1000))
	restore, err := json.Marshal(v.Restore)
	if err != nil {
		return fmt.Errorf("encode restore of %s: %w", v.ID, err)
	}
	r.restore = append(r.restore, string(restore))
	labels, err := jsonOrNull(v.Labels == nil, v.Labels)
	if err != nil {
		return fmt.Errorf("encode labels of %s: %w", v.ID, err)
	}
	forwards, err := jsonOrNull(v.Forwards == nil, v.Forwards)
	if err != nil {
		return fmt.Errorf("encode forwards of %s: %w", v.ID, err)
	}
	r.labels, r.forwards = append(r.labels, labels), append(r.forwards, forwards)
	x := expiry{ExpiresAt: v.ExpiresAt, OnExpiry: v.OnExpiry, RetainFor: v.RetainFor,
		TTLPausesWhileSuspended: v.TTLPausesWhileSuspended, ExpiryPaused: v.ExpiryPaused}
	exp, err := jsonOrNull(x == expiry{}, x)
	if err != nil {
		return fmt.Errorf("encode expiry of %s: %w", v.ID, err)
	}
	r.expiry = append(r.expiry, exp)
	r.wake = append(r.wake, v.WakeOnTraffic)
	idle, err := jsonOrNull(v.Idle.None(), v.Idle)
	if err != nil {
		return fmt.Errorf("encode idle of %s: %w", v.ID, err)
	}
	r.idle = append(r.idle, idle)
	return nil
}

func jsonOrNull(null bool, x any) (*string, error) {
	if null {
		return nil, nil
	}
	b, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	s := string(b)
	return &s, nil
}

// upsertRows writes rows, each only over a row of a lower seq: a view never
// goes back. The arrays are unnested into rows, one statement for the whole
// batch (bench/sql.go measured that shape the fastest); the JSON travels as
// text, cast in the statement, as older CockroachDB releases have no arrays
// of JSONB.
const upsertRows = `INSERT INTO torpor_sandboxes (` + columns + `)
SELECT id, name, phase, generation, driver, node, labels::JSONB, restore::JSONB, last_outcome, exit_code, reason,
  updated_at, updated_at_nanos, seq, forwards::JSONB, phase_since, phase_since_nanos, expiry::JSONB,
  last_active_at, last_active_at_nanos,
  wake_on_traffic,
  idle::JSONB
FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::INT8[], $5::TEXT[], $6::TEXT[], $7::TEXT[], $8::TEXT[],
  $9::TEXT[], $10::INT8[], $11::TEXT[], $12::TIMESTAMPTZ[], $13::INT4[], $14::INT8[], $15::TEXT[],
  $16::TIMESTAMPTZ[], $17::INT4[], $18::TEXT[],
  $19::TIMESTAMPTZ[], $20::INT4[],
  $21::BOOL[],
  $22::TEXT[])
  AS r (id, name, phase, generation, driver, node, labels, restore, last_outcome, exit_code, reason,
  updated_at, updated_at_nanos, seq, forwards, phase_since, phase_since_nanos, expiry,
  last_active_at, last_active_at_nanos,
  wake_on_traffic,
  idle)
ON CONFLICT (id) DO UPDATE SET name = excluded.name, phase = excluded.phase, generation = excluded.generation,
  driver = excluded.driver, node = excluded.node, labels = excluded.labels, restore = excluded.restore,
  last_outcome = excluded.last_outcome, exit_code = excluded.exit_code, reason = excluded.reason,
  updated_at = excluded.updated_at, updated_at_nanos = excluded.updated_at_nanos, seq = excluded.seq,
  forwards = excluded.forwards, phase_since = excluded.phase_since, phase_since_nanos = excluded.phase_since_nanos,
  expiry = excluded.expiry,
  last_active_at = excluded.last_active_at, last_active_at_nanos = excluded.last_active_at_nanos,
  wake_on_traffic = excluded.wake_on_traffic,
  idle = excluded.idle
WHERE torpor_sandboxes.seq < excluded.seq`

func (r *rows) args() []any {
	return []any{r.id, r.name, r.phase, r.generation, r.driver, r.node, r.labels, r.restore,
		r.outcome, r.exit, r.reason, r.at, r.nanos, r.seq, r.forwards, r.since, r.sinceNanos, r.expiry,
		r.active, r.activeNanos,
		r.wake,
		r.idle}
}

// history is events as the columns of one INSERT into torpor_history.
type history struct {
	seq                                                         []int64
	sandbox, typ, actor, command, correlation, id, cause, phase []string
	at                                                          []time.Time
	nanos                                                       []int32
	data                                                        []*string
}

func (h *history) add(env events.Envelope) {
	h.seq, h.sandbox, h.typ = append(h.seq, int64(env.Seq)), append(h.sandbox, env.SandboxID), append(h.typ, env.Type)
	h.at, h.nanos = append(h.at, env.Time.Truncate(time.Microsecond)), append(h.nanos, int32(env.Time.Nanosecond()%1000))
	h.actor, h.command, h.correlation = append(h.actor, env.Actor), append(h.command, env.CommandID), append(h.correlation, env.CorrelationID)
	h.id, h.cause, h.phase = append(h.id, env.ID), append(h.cause, env.CausationID), append(h.phase, string(env.Phase))
	var data *string
	if len(env.Data) > 0 {
		s := string(env.Data)
		data = &s
	}
	h.data = append(h.data, data)
}

// insertHistory adds the events the table lacks; one already there (a
// redelivery) stays as it is.
const insertHistory = `INSERT INTO torpor_history (seq, sandbox_id, type, "time", time_nanos, actor, command_id,
  correlation_id, data, event_id, causation_id, phase)
SELECT seq, sandbox_id, type, t, time_nanos, actor, command_id, correlation_id, data::JSONB, event_id, causation_id, phase
FROM unnest($1::INT8[], $2::TEXT[], $3::TEXT[], $4::TIMESTAMPTZ[], $5::INT4[], $6::TEXT[], $7::TEXT[], $8::TEXT[],
  $9::TEXT[], $10::TEXT[], $11::TEXT[], $12::TEXT[])
  AS h (seq, sandbox_id, type, t, time_nanos, actor, command_id, correlation_id, data, event_id, causation_id, phase)
ON CONFLICT (seq) DO NOTHING`

func (h *history) args() []any {
	return []any{h.seq, h.sandbox, h.typ, h.at, h.nanos, h.actor, h.command, h.correlation, h.data, h.id, h.cause, h.phase}
}

// parked is events the view could not apply, as the columns of one INSERT
// into torpor_parked.
type parked struct {
	seq                        []int64
	sandbox, typ, reason, data []string
}

func (p *parked) add(env events.Envelope, why error) {
	p.seq, p.sandbox, p.typ = append(p.seq, int64(env.Seq)), append(p.sandbox, clean(env.SandboxID)), append(p.typ, clean(env.Type))
	p.reason, p.data = append(p.reason, clean(why.Error())), append(p.data, clean(string(env.Data)))
}

const insertParked = `INSERT INTO torpor_parked (view, seq, sandbox_id, type, error, data)
SELECT $1, seq, sandbox_id, type, error, data
FROM unnest($2::INT8[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::TEXT[]) AS p (seq, sandbox_id, type, error, data)
ON CONFLICT (view, seq) DO NOTHING`

func (p *parked) args(view string) []any {
	return []any{view, p.seq, p.sandbox, p.typ, p.reason, p.data}
}
