-- Workflows: definitions (versioned, stored as canonical JSON), runs,
-- their steps, and the events that tell the workflow layer to look at a
-- run again. A run's tasks are ordinary tasks that also name their run,
-- step and item.
CREATE TABLE workflows (
    name       TEXT NOT NULL,
    version    INTEGER NOT NULL,
    hash       TEXT NOT NULL,
    definition BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE runs (
    id              INTEGER PRIMARY KEY,
    workflow        TEXT NOT NULL,
    version         INTEGER NOT NULL,
    state           TEXT NOT NULL,
    input           BLOB,
    output          BLOB,
    error           TEXT NOT NULL DEFAULT '',
    idempotency_key TEXT,
    ckey            TEXT NOT NULL DEFAULT '',  -- the workflow concurrency's key value
    climit          INTEGER NOT NULL DEFAULT 0, -- active runs per (workflow, ckey); 0 = none
    seq             INTEGER NOT NULL DEFAULT 0, -- decisions applied
    created_at      INTEGER NOT NULL,
    started_at      INTEGER,
    finished_at     INTEGER
);
CREATE UNIQUE INDEX runs_idempotency ON runs (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_workflow ON runs (workflow, id);
CREATE INDEX runs_state ON runs (state, id);
-- Runs waiting for the workflow's concurrency, oldest first per key.
CREATE INDEX runs_queued ON runs (workflow, ckey, id) WHERE state = 'queued';

-- Active (running or paused) runs per (workflow, key) under a workflow
-- concurrency limit.
CREATE TABLE run_slots (
    workflow TEXT NOT NULL,
    ckey     TEXT NOT NULL,
    active   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (workflow, ckey)
) WITHOUT ROWID;

CREATE TABLE run_steps (
    id                INTEGER PRIMARY KEY,
    run_id            INTEGER NOT NULL,
    name              TEXT NOT NULL,
    idx               INTEGER NOT NULL,
    state             TEXT NOT NULL,
    items             INTEGER NOT NULL DEFAULT -1, -- -1: one task; else fan-out items
    win               INTEGER,                     -- window; NULL = none
    active            INTEGER NOT NULL DEFAULT 0,  -- unfinished items in the window
    waiting           INTEGER NOT NULL DEFAULT 0,  -- items waiting for the window
    remaining         INTEGER NOT NULL DEFAULT 0,  -- unfinished tasks
    failed            INTEGER NOT NULL DEFAULT 0,  -- tasks ended failed or cancelled
    continue_on_error INTEGER NOT NULL DEFAULT 0,
    output            BLOB,
    error             TEXT NOT NULL DEFAULT '',
    created_at        INTEGER NOT NULL,
    finished_at       INTEGER,
    UNIQUE (run_id, name)
);

CREATE TABLE run_events (
    id         INTEGER PRIMARY KEY,
    run_id     INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

ALTER TABLE tasks ADD COLUMN run_id INTEGER;
ALTER TABLE tasks ADD COLUMN step_id INTEGER;
ALTER TABLE tasks ADD COLUMN item INTEGER;
-- 0 while a fan-out item waits for its window (state waiting), then 1.
ALTER TABLE tasks ADD COLUMN windowed INTEGER NOT NULL DEFAULT 1;
-- 1 once a run task's end has been counted in its step.
ALTER TABLE tasks ADD COLUMN settled INTEGER NOT NULL DEFAULT 0;
CREATE INDEX tasks_run ON tasks (run_id, id) WHERE run_id IS NOT NULL;
CREATE INDEX tasks_step ON tasks (step_id, item) WHERE step_id IS NOT NULL;
-- The window's wait list: the next items in item order.
CREATE INDEX tasks_waiting ON tasks (step_id, item) WHERE state = 'waiting';
-- Run tasks that ended in the current transaction and are not yet
-- counted in their step: the index holds only those.
CREATE INDEX tasks_unsettled ON tasks (id)
    WHERE step_id IS NOT NULL AND settled = 0 AND state IN ('succeeded', 'failed', 'cancelled');
-- A waiting item has a dispatch deadline too.
DROP INDEX tasks_deadline;
CREATE INDEX tasks_deadline ON tasks (dispatch_deadline_at)
    WHERE dispatch_deadline_at IS NOT NULL AND state IN ('waiting', 'scheduled', 'queued', 'ready', 'paused');
