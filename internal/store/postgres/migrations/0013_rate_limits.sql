-- Concurrency strategies and rate limits (docs/flow-control.md).
ALTER TABLE queues ADD COLUMN strategy TEXT NOT NULL DEFAULT 'queue';
ALTER TABLE queues ADD COLUMN rate_limit BIGINT;            -- starts per period; NULL = none
ALTER TABLE queues ADD COLUMN rate_period_us BIGINT;
ALTER TABLE queues ADD COLUMN rate_per_key BOOLEAN NOT NULL DEFAULT false;

-- A rate-limited sub-queue's bucket (the queue, or 'queue key' per key),
-- limit and period, copied from its queue as lim is; rwait: the time of
-- its next chance while its bucket has no allowance (it is then not
-- eligible: the refill never reads rate-blocked backlog).
ALTER TABLE subqueues ADD COLUMN rbucket TEXT;
ALTER TABLE subqueues ADD COLUMN rlim BIGINT;
ALTER TABLE subqueues ADD COLUMN rper BIGINT;
ALTER TABLE subqueues ADD COLUMN rwait BIGINT;
DROP INDEX subqueues_eligible;
CREATE INDEX subqueues_eligible ON subqueues (rr)
    WHERE queued > 0 AND NOT paused AND (lim IS NULL OR running < lim) AND rwait IS NULL;
CREATE INDEX subqueues_rate_wait ON subqueues (rwait) WHERE rwait IS NOT NULL;

-- rated: the task was made ready on its bucket's allowance; its start is
-- recorded in rate_starts when it moves to running.
ALTER TABLE tasks ADD COLUMN rated BOOLEAN NOT NULL DEFAULT false;

-- The starts of each bucket within its period (older ones are pruned).
CREATE TABLE rate_starts (
    bucket TEXT NOT NULL,
    at     BIGINT NOT NULL
);
CREATE INDEX rate_starts_bucket ON rate_starts (bucket, at);

-- Every path into running (a claim of any form) records the start.
CREATE FUNCTION sluice_rate_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO rate_starts (bucket, at)
        SELECT s.rbucket, NEW.started_at FROM subqueues s WHERE s.id = NEW.sq AND s.rbucket IS NOT NULL;
    RETURN NULL;
END
$$;
CREATE TRIGGER rate_start AFTER UPDATE OF state ON tasks FOR EACH ROW
    WHEN (NEW.rated AND NEW.state = 'running' AND OLD.state <> 'running')
    EXECUTE FUNCTION sluice_rate_start();
