-- Views of the past (torpor replay --until: torpor_sandboxes_at_<seq> and
-- torpor_history_at_<seq>) and when each was made: serve drops them once
-- --replay-ttl has passed since (projections/sqlview ReapPast).
CREATE TABLE IF NOT EXISTS torpor_past (
  seq INT8 PRIMARY KEY,
  made_at TIMESTAMPTZ NOT NULL
);
