-- wake_on_traffic (README "Wake on traffic"): create's wake_on_traffic, as
-- the view has it; false in a row written before it was kept, until the
-- sandbox's row is next written.
ALTER TABLE torpor_sandboxes ADD COLUMN IF NOT EXISTS wake_on_traffic BOOL NOT NULL DEFAULT false;
