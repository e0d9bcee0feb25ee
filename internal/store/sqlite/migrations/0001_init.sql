-- sluice schema v1 (SQLite). Times are unix microseconds (UTC).

-- One row: environment-wide slot counters and settings.
CREATE TABLE env (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    max_running INTEGER NOT NULL DEFAULT 0,  -- 0 = unlimited
    running     INTEGER NOT NULL DEFAULT 0,  -- tasks holding slots (ready + running)
    active      INTEGER NOT NULL DEFAULT 0,  -- unfinished tasks (admission)
    vtime       INTEGER NOT NULL DEFAULT 0,  -- fair-queueing virtual time: highest rank claimed
    rr          INTEGER NOT NULL DEFAULT 0   -- round-robin sequence for sub-queues
);
INSERT INTO env (id) VALUES (1);

CREATE TABLE queues (
    name              TEXT PRIMARY KEY,
    concurrency_limit INTEGER,               -- NULL = unbounded; per sub-queue
    max_backlog       INTEGER,               -- NULL = none; unfinished tasks
    paused            INTEGER NOT NULL DEFAULT 0,
    active            INTEGER NOT NULL DEFAULT 0,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);

-- A sub-queue is (queue, concurrency key); key '' is the queue's shared one.
-- lim and paused are copies of the queue's so eligibility is one row.
CREATE TABLE subqueues (
    id      INTEGER PRIMARY KEY,
    queue   TEXT NOT NULL,
    ckey    TEXT NOT NULL,
    lim     INTEGER,
    paused  INTEGER NOT NULL DEFAULT 0,
    running INTEGER NOT NULL DEFAULT 0,      -- tasks holding a slot
    queued  INTEGER NOT NULL DEFAULT 0,      -- tasks waiting for a slot
    rr      INTEGER NOT NULL DEFAULT 0,      -- last served (round-robin)
    vtime   INTEGER NOT NULL DEFAULT 0,      -- last rank handed out
    UNIQUE (queue, ckey)
);
-- Sub-queues that could take a slot now: the refill reads only these.
CREATE INDEX subqueues_eligible ON subqueues (rr)
    WHERE queued > 0 AND paused = 0 AND (lim IS NULL OR running < lim);

CREATE TABLE tasks (
    id                   INTEGER PRIMARY KEY,
    kind                 TEXT NOT NULL,
    queue                TEXT NOT NULL,
    ckey                 TEXT NOT NULL DEFAULT '',
    sq                   INTEGER NOT NULL,
    priority             INTEGER NOT NULL DEFAULT 0,
    state                TEXT NOT NULL,
    paused_from          TEXT,
    attempt              INTEGER NOT NULL DEFAULT 0,
    max_attempts         INTEGER NOT NULL,
    input                BLOB,
    output               BLOB,
    error                TEXT NOT NULL DEFAULT '',
    timeout_us           INTEGER NOT NULL DEFAULT 0,
    run_at               INTEGER NOT NULL,
    dispatch_deadline_at INTEGER,
    idempotency_key      TEXT,
    created_at           INTEGER NOT NULL,
    started_at           INTEGER,
    finished_at          INTEGER,
    worker_id            TEXT,
    timeout_at           INTEGER,
    cancel_requested     INTEGER NOT NULL DEFAULT 0,
    rank                 INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX tasks_idempotency ON tasks (idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Claim: ready tasks per kind, best priority, then fair rank, then age.
CREATE INDEX tasks_ready ON tasks (kind, priority DESC, rank, id) WHERE state = 'ready';
-- Refill: the head of a sub-queue.
CREATE INDEX tasks_queued ON tasks (sq, priority DESC, id) WHERE state = 'queued';
CREATE INDEX tasks_due ON tasks (run_at) WHERE state = 'scheduled';
CREATE INDEX tasks_running ON tasks (worker_id) WHERE state = 'running';
CREATE INDEX tasks_timeout ON tasks (timeout_at) WHERE state = 'running' AND timeout_at IS NOT NULL;
CREATE INDEX tasks_deadline ON tasks (dispatch_deadline_at)
    WHERE dispatch_deadline_at IS NOT NULL AND state IN ('scheduled', 'queued', 'ready', 'paused');
CREATE INDEX tasks_queue_state ON tasks (queue, state);
CREATE INDEX tasks_state ON tasks (state);
CREATE INDEX tasks_kind ON tasks (kind);

CREATE TABLE attempts (
    task_id     INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    worker_id   TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER NOT NULL,
    state       TEXT NOT NULL,
    error       TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (task_id, attempt)
) WITHOUT ROWID;

CREATE TABLE workers (
    id                TEXT PRIMARY KEY,
    name              TEXT NOT NULL,
    kinds             TEXT NOT NULL,         -- JSON array
    slots             INTEGER NOT NULL,
    free_slots        INTEGER NOT NULL,
    started_at        INTEGER NOT NULL,
    last_heartbeat_at INTEGER NOT NULL,
    lease_expires_at  INTEGER NOT NULL
);
CREATE INDEX workers_lease ON workers (lease_expires_at);

CREATE TABLE worker_kinds (
    kind      TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    PRIMARY KEY (kind, worker_id)
) WITHOUT ROWID;
