-- Retrying a run from where it failed (RetryRun, store/run_retry.go).
-- runs.retry counts the run's retries; run_steps.pass is the run's retry
-- when the step was created or last run again, so that the workflow
-- layer tells a step of an earlier pass that did not succeed (it runs
-- again) from one of the current pass (it ends the run). tasks.deadline_us
-- is the length of a run task's dispatch deadline once a retry of its run
-- has measured it again from the retry; NULL: dispatch_deadline_at −
-- created_at, as before. The same columns as
-- internal/store/sqlite/migrations/0017_run_retry.sql. A constant default
-- and a nullable column rewrite no row, and replicas of earlier versions
-- (which neither read nor write them) may run beside this one: a step
-- they create counts as of the first pass.
ALTER TABLE runs ADD COLUMN retry INTEGER NOT NULL DEFAULT 0;
ALTER TABLE run_steps ADD COLUMN pass INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN deadline_us BIGINT;
