-- Tenant churn (docs/benchmarks.md, "Tenant churn on PostgreSQL"): the
-- rows kept per concurrency key are vacuumed as keys come and go, however
-- many idle keys the tables hold.
--
-- Every write of a sub-queue's counters changes running, queued or rr,
-- which subqueues_eligible names (its key or its predicate), so no such
-- write can be a HOT update: each leaves a dead row version and a new
-- entry in every index. A new key enters the eligible index at the front
-- of the refill's scan and leaves it once served; keyed by (rr, id)
-- (0019) the index keeps those dead entries where every refill starts
-- until subqueues is vacuumed, so the refill's read grows with the keys
-- churned since the last vacuum. With autovacuum's defaults a vacuum
-- waits for dead rows worth 20 % of the table: 200,000 for a million idle
-- keys, which churning keys may take minutes to reach (measured: the read
-- grew to 300 shared buffers a call after 60,000 keys with no vacuum, and
-- fell from 223 to 92 at the first vacuum with these settings). Here it is
-- 1,000 plus 1 %, and as many inserts (new keys). A fillfactor would buy
-- subqueues nothing: no counter write can be HOT.
--
-- run_slots' writes change only active, in no index: they are HOT when
-- the row's page has room, which a fillfactor keeps (measured: 57 % of
-- 20,000 writes HOT at 90, none at the default 100).
--
-- The settings take no lock that writes wait for and rewrite nothing (a
-- fillfactor applies to pages filled from now on); replicas of earlier
-- versions may keep running. Where autovacuum is off for the server, they
-- change nothing.
ALTER TABLE subqueues SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 1000
);
ALTER TABLE run_slots SET (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 1000
);
