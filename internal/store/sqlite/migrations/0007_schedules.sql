-- Cron schedules of workflows (the `schedules` of a definition's latest
-- version): when each fires next, and whether it is paused. A firing
-- moves next_at on with a compare-and-set, so one tick starts one run
-- however many servers look.
CREATE TABLE schedules (
    id          INTEGER PRIMARY KEY,
    workflow    TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    version     INTEGER NOT NULL,
    cron        TEXT NOT NULL,
    input       BLOB,
    paused      INTEGER NOT NULL DEFAULT 0,
    next_at     INTEGER NOT NULL,
    last_run_id INTEGER,
    last_at     INTEGER,
    created_at  INTEGER NOT NULL,
    UNIQUE (workflow, idx)
);
CREATE INDEX schedules_due ON schedules (next_at) WHERE paused = 0;
