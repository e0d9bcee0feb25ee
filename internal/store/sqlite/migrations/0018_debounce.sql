-- Debounce (S-FC10; store/debounce.go, flow/debounce.go). A queue's
-- debounce: its period and max_wait in µs (NULL period: none) and
-- whether each concurrency key debounces apart. A debounced task carries
-- its group (its kind, and with per_key its key: debounce_group), the
-- latest start its max_wait allows (debounce_until, NULL: no cap) and
-- how many triggers it stands for (debounce_triggers); a task that is
-- not debounced has NULL in all three. tasks_debounce finds a group's
-- newest task. debounce_keys holds the idempotency keys of debounced
-- triggers, with the input each sent, so that a repeat gets its first
-- answer even after a later trigger replaced the task's input.
ALTER TABLE queues ADD COLUMN debounce_period_us INTEGER;
ALTER TABLE queues ADD COLUMN debounce_max_wait_us INTEGER;
ALTER TABLE queues ADD COLUMN debounce_per_key INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN debounce_group TEXT;
ALTER TABLE tasks ADD COLUMN debounce_until INTEGER;
ALTER TABLE tasks ADD COLUMN debounce_triggers INTEGER;
CREATE INDEX tasks_debounce ON tasks (queue, debounce_group, id) WHERE debounce_group IS NOT NULL;
CREATE TABLE debounce_keys (
    idempotency_key TEXT PRIMARY KEY,
    task_id INTEGER NOT NULL,
    input BLOB
);
CREATE INDEX debounce_keys_task ON debounce_keys (task_id);
