-- A rate limit's burst (docs/flow-control.md, "Rate limits"): at most
-- rate_burst starts at once, the rest spread one per period / limit.
-- NULL: the limit, the window alone, as before this migration, so no
-- existing queue changes. The refill reads it from the queue's row with
-- its pending count (rate.go); the sub-queues carry no copy.
ALTER TABLE queues ADD COLUMN rate_burst INTEGER;
