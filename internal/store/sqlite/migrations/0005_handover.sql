-- Handover (QueueParams.Handover): a queued task reserved for a worker to
-- start on the slot of a task it runs (after_id) when that ends. It holds
-- no slot of its own, so it counts in neither sub-queue counter.
ALTER TABLE queues ADD COLUMN handover INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN handover INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN after_id INTEGER;
CREATE INDEX tasks_reserved ON tasks (after_id) WHERE state = 'reserved';
CREATE INDEX tasks_reserved_worker ON tasks (worker_id) WHERE state = 'reserved';
