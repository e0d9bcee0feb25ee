-- Lent slots that serve only the lender's child (store/flow/lend.go).
-- tasks.wait_lent is now a suspended parent's hold (flow.Hold): 0 it
-- holds its sub-queue slot, 1 it lent it and its child holds it, 2 it
-- lent it and holds it for its child, which has not started on it, 3 its
-- child ended and it waits for an environment slot in the refill's lane,
-- 4 it lent it and is owed one (its child passed it on down the family).
-- The rows of earlier versions hold 0 or 1, which keep their meaning.
-- env.lane counts the parents in the lane (holds 2, 3 and 4).
ALTER TABLE env ADD COLUMN lane INTEGER NOT NULL DEFAULT 0;
-- The lending parents of a sub-queue (holds 1, 2 and 4), reconciled with
-- their children after a move in the sub-queue.
CREATE INDEX tasks_lending ON tasks (sq) WHERE wait_lent IN (1, 2, 4);
-- The refill's lane (holds 2, 3 and 4).
CREATE INDEX tasks_lane ON tasks (id) WHERE wait_lent IN (2, 3, 4);
-- The parents waiting for a child in a sub-queue (the cycle check).
CREATE INDEX tasks_suspended ON tasks (sq) WHERE state = 'suspended';
