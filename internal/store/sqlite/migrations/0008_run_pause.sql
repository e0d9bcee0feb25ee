-- Pausing a run: its waiting tasks become paused and remember the state
-- they left (paused_from); run_paused tells them from the tasks of a
-- paused queue, which a queue's resume returns. A paused run remembers
-- whether it was running or queued. A paused workflow keeps its new runs
-- queued.
ALTER TABLE tasks ADD COLUMN run_paused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN paused_from TEXT;
CREATE TABLE workflow_pauses (
    name      TEXT PRIMARY KEY,
    paused_at INTEGER NOT NULL
);
