-- Concurrency strategies and rate limits (docs/flow-control.md).
ALTER TABLE queues ADD COLUMN strategy TEXT NOT NULL DEFAULT 'queue';
ALTER TABLE queues ADD COLUMN rate_limit INTEGER;           -- starts per period; NULL = none
ALTER TABLE queues ADD COLUMN rate_period_us INTEGER;
ALTER TABLE queues ADD COLUMN rate_per_key INTEGER NOT NULL DEFAULT 0;

-- A rate-limited sub-queue's bucket (the queue, or 'queue key' per key),
-- limit and period, copied from its queue as lim is; rwait: the time of
-- its next chance while its bucket has no allowance (it is then not
-- eligible: the refill never reads rate-blocked backlog).
ALTER TABLE subqueues ADD COLUMN rbucket TEXT;
ALTER TABLE subqueues ADD COLUMN rlim INTEGER;
ALTER TABLE subqueues ADD COLUMN rper INTEGER;
ALTER TABLE subqueues ADD COLUMN rwait INTEGER;
DROP INDEX subqueues_eligible;
CREATE INDEX subqueues_eligible ON subqueues (rr)
    WHERE queued > 0 AND paused = 0 AND (lim IS NULL OR running < lim) AND rwait IS NULL;
CREATE INDEX subqueues_rate_wait ON subqueues (rwait) WHERE rwait IS NOT NULL;

-- rated: the task was made ready on its bucket's allowance; its start is
-- recorded in rate_starts when it moves to running.
ALTER TABLE tasks ADD COLUMN rated INTEGER NOT NULL DEFAULT 0;

-- The starts of each bucket within its period (older ones are pruned).
CREATE TABLE rate_starts (
    bucket TEXT NOT NULL,
    at     INTEGER NOT NULL
);
CREATE INDEX rate_starts_bucket ON rate_starts (bucket, at);

-- Every path into running (a claim of any form) records the start.
CREATE TRIGGER rate_start AFTER UPDATE OF state ON tasks
    WHEN NEW.rated AND NEW.state = 'running' AND OLD.state <> 'running'
BEGIN
    INSERT INTO rate_starts (bucket, at)
        SELECT rbucket, NEW.started_at FROM subqueues WHERE id = NEW.sq AND rbucket IS NOT NULL;
END;
