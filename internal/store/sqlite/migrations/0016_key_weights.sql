-- Weighted fairness across keys (docs/flow-control.md, "Weighted
-- fairness"; store/flow/fair.go). A sub-queue's weight (a queue's
-- key_weights, default 1) is its own column, so the refill and the claims
-- read nothing more for it; the queue's answer lists the keys whose
-- weight is not 1 through subqueues_weighted.
ALTER TABLE subqueues ADD COLUMN weight INTEGER NOT NULL DEFAULT 1 CHECK (weight >= 1);
CREATE INDEX subqueues_weighted ON subqueues (queue, ckey) WHERE weight <> 1;

-- Ranks and the round-robin clock now advance by flow.Unit (1,000,000)
-- per task of weight 1 instead of 1. Every value already stored is
-- scaled to match, so what waits keeps its place: a task made ready
-- before the upgrade is claimed in the same order against those made
-- ready after it, and no sub-queue jumps ahead or falls behind. (Ranks
-- of finished tasks are never read again.) Replicas of earlier versions
-- would go on giving ranks a millionth apart: stop every server before
-- this migration runs.
UPDATE env SET vtime = vtime * 1000000, rr = rr * 1000000;
UPDATE subqueues SET vtime = vtime * 1000000, rr = rr * 1000000;
UPDATE tasks SET rank = rank * 1000000 WHERE rank <> 0 AND state NOT IN ('succeeded', 'failed', 'cancelled');
