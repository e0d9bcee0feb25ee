-- Pausing a run: its waiting tasks become paused and remember the state
-- they left (paused_from); run_paused tells them from the tasks of a
-- paused queue, which a queue's resume returns. A paused run remembers
-- whether it was running or queued. A paused workflow keeps its new runs
-- queued. The same columns and table as
-- internal/store/sqlite/migrations/0008_run_pause.sql; the constant
-- defaults rewrite no row. A run's paused tasks are found through
-- tasks_run, so no index is added.
ALTER TABLE tasks ADD COLUMN run_paused BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE runs ADD COLUMN paused_from TEXT;
CREATE TABLE workflow_pauses (
    name      TEXT PRIMARY KEY,
    paused_at BIGINT NOT NULL
);
