-- S-W4: workers report memory use and recent p99 task latency with each
-- heartbeat; GET /v1/workers shows them.
ALTER TABLE workers ADD COLUMN memory_used_ratio DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN p99_latency_us BIGINT NOT NULL DEFAULT 0;
