-- S-W4: workers report memory use and recent p99 task latency with each
-- heartbeat; GET /v1/workers shows them.
ALTER TABLE workers ADD COLUMN memory_used_ratio REAL NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN p99_latency_us INTEGER NOT NULL DEFAULT 0;
