-- Writers that share nothing run in parallel (docs/architecture.md, "How
-- writes scale"). The environment's counters leave the env row, which
-- every write locked, for env_slices: each write transaction adds its
-- changes to the slice of its connection (pg_backend_pid() % 64), so
-- transactions on different connections write different rows; the
-- environment's running and active are the sums of the slices, its
-- fair-queueing time and round-robin clock their greatest values. env
-- keeps the settings (max_running) and the refill's lane, which only a
-- transaction holding the write lock exclusively changes.
--
-- Replicas of earlier versions lock and write the env row's counters:
-- stop every replica before this migration runs (their writes fail on
-- the dropped columns if one is left running; they change nothing).
CREATE TABLE env_slices (
    slice   INTEGER PRIMARY KEY CHECK (slice >= 0 AND slice < 64),
    running BIGINT NOT NULL DEFAULT 0,   -- this slice's share of tasks holding slots
    active  BIGINT NOT NULL DEFAULT 0,   -- this slice's share of unfinished tasks
    vtime   BIGINT NOT NULL DEFAULT 0,   -- the highest rank claimed through it
    rr      BIGINT NOT NULL DEFAULT 0    -- the highest round-robin value given through it
) WITH (fillfactor = 50);
INSERT INTO env_slices (slice, running, active, vtime, rr) SELECT 0, running, active, vtime, rr FROM env WHERE id = 1;
INSERT INTO env_slices (slice) SELECT g FROM generate_series(1, 63) AS g;
ALTER TABLE env DROP COLUMN running, DROP COLUMN active, DROP COLUMN vtime, DROP COLUMN rr;
