-- Parking (store/flow/kinds.go): a task whose kind no registered worker
-- serves waits paused with paused_from 'unserved', holding no slot and
-- on no wait list, until a worker of its kind registers. The tasks of
-- such kinds that wait (queued or ready) when this migration runs are
-- parked by its Go step (kinds.go, parkStrays), in the same transaction.
CREATE INDEX tasks_unserved ON tasks (kind) WHERE state = 'paused' AND paused_from = 'unserved';
