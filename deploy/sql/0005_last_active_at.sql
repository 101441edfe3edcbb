-- last_active_at (README "Activity"): the time of the sandbox's latest
-- activity (a command's event, or a sandbox.active's at), with its
-- nanoseconds beside it as for updated_at. NULL when there was none, and in
-- a row written before it was kept, until the sandbox is next active.
ALTER TABLE torpor_sandboxes ADD COLUMN IF NOT EXISTS last_active_at TIMESTAMPTZ;
ALTER TABLE torpor_sandboxes ADD COLUMN IF NOT EXISTS last_active_at_nanos INT4 NOT NULL DEFAULT 0;
