-- expiry (issue 27): a sandbox's expiry policies from its create, as the
-- view has them: {"expires_at","on_expiry","retain_for"}, each omitted
-- when none; NULL when the sandbox has none (and in rows written before).
-- JSON keeps expires_at to the nanosecond, as the view does.
ALTER TABLE torpor_sandboxes ADD COLUMN IF NOT EXISTS expiry JSONB;
