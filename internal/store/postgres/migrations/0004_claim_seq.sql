-- The number the worker gave the claim call that handed a running task out
-- (0: not numbered). A heartbeat that says every claim up to N was
-- answered (claims_settled) and does not list a task claimed by a call
-- numbered 1..N shows the answer was lost: the task goes back to the flow
-- instead of running nowhere while holding its slots.
ALTER TABLE tasks ADD COLUMN claim_seq BIGINT NOT NULL DEFAULT 0;
