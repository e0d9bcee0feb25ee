-- Retrying a failed or cancelled task (RetryTask) gives it as many more
-- attempts as it was created with: max_attempts becomes attempt + that
-- budget, so attempt numbers go on and the attempts table keeps its
-- history. attempt_budget remembers the budget once max_attempts no
-- longer says it; NULL: never retried, the budget is max_attempts. The
-- same column as internal/store/sqlite/migrations/0009_task_retry.sql; a
-- column with no default rewrites no row.
ALTER TABLE tasks ADD COLUMN attempt_budget INTEGER;
