-- idle (issue 27, README "Idle and wake"): the sandbox's idle policy from
-- its create, as the view has it: {"after","action","fallback"}; NULL when
-- it has none (and in rows written before). Numbered 0007: 0005 is
-- last_active_at and 0006 is kept for wake on traffic.
ALTER TABLE torpor_sandboxes ADD COLUMN IF NOT EXISTS idle JSONB;
