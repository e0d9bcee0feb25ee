-- Child tasks and waits (store/children.go).
-- A parent's children, keyed by parent and call order: a task or a run.
CREATE TABLE children (
    parent_id INTEGER NOT NULL,
    call      INTEGER NOT NULL,
    task_id   INTEGER,
    run_id    INTEGER,
    PRIMARY KEY (parent_id, call)
);
CREATE INDEX children_task ON children (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX children_run ON children (run_id) WHERE run_id IS NOT NULL;
-- The parent's call positions: child_calls of attempt child_attempt.
ALTER TABLE tasks ADD COLUMN child_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN child_attempt INTEGER NOT NULL DEFAULT 0;
-- A waiting parent: the child it waits for (task or run), and whether it
-- lent its sub-queue slot (1) or kept it (0). wait_task/wait_run stay set
-- while it waits for its slots back (queued or ready, held by its worker).
ALTER TABLE tasks ADD COLUMN wait_task INTEGER;
ALTER TABLE tasks ADD COLUMN wait_run INTEGER;
ALTER TABLE tasks ADD COLUMN wait_lent INTEGER NOT NULL DEFAULT 0;
-- Sub-queue slots lent to suspended parents (at most lim).
ALTER TABLE subqueues ADD COLUMN lent INTEGER NOT NULL DEFAULT 0;
-- A worker's suspended parents and its parents waiting for slots.
CREATE INDEX tasks_held_waits ON tasks (worker_id) WHERE wait_task IS NOT NULL OR wait_run IS NOT NULL;
-- Runs started by a workflow step (a child run): the parent run's step.
ALTER TABLE runs ADD COLUMN parent_run_id INTEGER;
ALTER TABLE runs ADD COLUMN parent_step_id INTEGER;
CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
