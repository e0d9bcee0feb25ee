-- Retention of finished runs: oldest first, like finished tasks.
CREATE INDEX runs_finished ON runs (finished_at) WHERE state IN ('succeeded', 'failed', 'cancelled');
