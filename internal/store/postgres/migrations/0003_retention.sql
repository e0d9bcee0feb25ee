-- S-ST4: finished tasks are deleted after the retention period, oldest
-- first, in bounded batches.
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE state IN ('succeeded', 'failed', 'cancelled');
