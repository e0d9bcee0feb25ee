-- Debounce (S-FC10; store/debounce.go, flow/debounce.go). The same
-- columns and table as internal/store/sqlite/migrations/0018_debounce.sql:
-- a queue's debounce (period and max_wait in µs, NULL period: none;
-- per_key), a debounced task's group, latest start and count of the
-- triggers it stands for (NULL for a task that is not debounced), and
-- the idempotency keys of debounced triggers with the input each sent.
-- Nullable columns and a constant default rewrite no row. Replicas of
-- earlier versions may run beside this one: they neither debounce nor
-- read the columns (a trigger through one of them is not debounced).
ALTER TABLE queues ADD COLUMN debounce_period_us BIGINT;
ALTER TABLE queues ADD COLUMN debounce_max_wait_us BIGINT;
ALTER TABLE queues ADD COLUMN debounce_per_key BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE tasks ADD COLUMN debounce_group TEXT;
ALTER TABLE tasks ADD COLUMN debounce_until BIGINT;
ALTER TABLE tasks ADD COLUMN debounce_triggers INTEGER;
CREATE INDEX tasks_debounce ON tasks (queue, debounce_group, id) WHERE debounce_group IS NOT NULL;
CREATE TABLE debounce_keys (
    idempotency_key TEXT PRIMARY KEY,
    task_id BIGINT NOT NULL,
    input BYTEA
);
CREATE INDEX debounce_keys_task ON debounce_keys (task_id);
