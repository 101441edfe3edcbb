-- phase_since (CONTRACT §6): when the sandbox entered its current phase,
-- with its nanoseconds beside it as for updated_at. NULL in a row written
-- before it was kept, until the sandbox's phase next changes: a list sorted
-- by age in phase then takes updated_at. The index serves the list sorted
-- by name, in byte order (COLLATE "C"), as the KV view sorts.
ALTER TABLE torpor_sandboxes ADD COLUMN IF NOT EXISTS phase_since TIMESTAMPTZ;
ALTER TABLE torpor_sandboxes ADD COLUMN IF NOT EXISTS phase_since_nanos INT4 NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS torpor_sandboxes_name ON torpor_sandboxes (name COLLATE "C", id);
