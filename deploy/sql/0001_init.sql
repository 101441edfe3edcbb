-- The SQL view (CONTRACT §6). Statements that PostgreSQL and CockroachDB
-- both accept; every one is idempotent (IF NOT EXISTS), so a migration that
-- ran halfway runs again whole.

-- One row per sandbox: the phase view's fields. labels, restore and forwards
-- are the view's JSON. PostgreSQL keeps microseconds, so updated_at_nanos is
-- the rest of the event's time (0 to 999 ns) and a row reads back exactly.
CREATE TABLE IF NOT EXISTS torpor_sandboxes (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  phase TEXT NOT NULL,
  generation INT8 NOT NULL,
  driver TEXT NOT NULL,
  node TEXT NOT NULL,
  labels JSONB,
  restore JSONB NOT NULL,
  last_outcome TEXT NOT NULL,
  exit_code INT8,
  reason TEXT NOT NULL,
  updated_at TIMESTAMPTZ NOT NULL,
  updated_at_nanos INT4 NOT NULL DEFAULT 0,
  seq INT8 NOT NULL,
  forwards JSONB
);
CREATE INDEX IF NOT EXISTS torpor_sandboxes_phase ON torpor_sandboxes (phase);

-- One row per event of the log, by stream sequence: the audit history.
-- event_id, causation_id and phase are the envelope's, beside the
-- contract's columns, so that a history read from here is the log's.
CREATE TABLE IF NOT EXISTS torpor_history (
  seq INT8 PRIMARY KEY,
  sandbox_id TEXT NOT NULL,
  type TEXT NOT NULL,
  "time" TIMESTAMPTZ NOT NULL,
  time_nanos INT4 NOT NULL DEFAULT 0,
  actor TEXT NOT NULL,
  command_id TEXT NOT NULL,
  correlation_id TEXT NOT NULL,
  data JSONB,
  event_id TEXT NOT NULL,
  causation_id TEXT NOT NULL,
  phase TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS torpor_history_sandbox ON torpor_history (sandbox_id, seq);

-- The highest stream sequence each view holds, written in the transaction
-- of the rows it covers.
CREATE TABLE IF NOT EXISTS torpor_checkpoints (
  view TEXT PRIMARY KEY,
  seq INT8 NOT NULL
);

-- Events a view could not apply: kept, with why, for an operator; the view
-- went on without them. data is the event's data as the log holds it (text:
-- it may be what JSONB refuses).
CREATE TABLE IF NOT EXISTS torpor_parked (
  view TEXT NOT NULL,
  seq INT8 NOT NULL,
  sandbox_id TEXT NOT NULL,
  type TEXT NOT NULL,
  error TEXT NOT NULL,
  data TEXT,
  parked_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (view, seq)
);
