package store

// The doctor's counts, written in SQL both stores' dialects accept (the
// stores' doctor.go wrap them in their own CTE of unfinished tasks,
// "live"): the numbers the rows give, per sub-queue, per step and per
// workflow and key (run places), and the subjects the findings name.
// The checks and the repair read them alike.
const (
	DoctorSqCounts = `SELECT sq, count(*) FILTER (WHERE state IN ('ready', 'running') OR state = 'suspended' AND wait_lent NOT IN (1, 4)) AS running,
			count(*) FILTER (WHERE state = 'queued') AS queued,
			count(*) FILTER (WHERE state = 'suspended' AND wait_lent IN (1, 2, 4)) AS lent
		FROM live GROUP BY sq`
	DoctorStepCounts = `SELECT step_id, count(*) AS remaining, count(*) FILTER (WHERE state = 'waiting') AS waiting,
			count(*) FILTER (WHERE windowed) AS active
		FROM live WHERE step_id IS NOT NULL GROUP BY step_id`
	DoctorPlaceCounts = `SELECT workflow, ckey, count(*) AS n FROM runs
		WHERE climit > 0 AND (state = 'running' OR state = 'paused' AND paused_from = 'running') GROUP BY workflow, ckey`
	DoctorQueueCounts = `SELECT queue, count(*) AS n FROM live GROUP BY queue`
	DoctorEnvCounts   = `SELECT count(*) FILTER (WHERE state IN ('ready', 'running')) AS running, count(*) AS active,
			count(*) FILTER (WHERE state = 'suspended' AND wait_lent IN (2, 3, 4)) AS lane FROM live`

	DoctorSqSubject   = `s.queue || '/' || s.ckey`
	DoctorStepSubject = `'run ' || s.run_id || ' step ' || s.name`
)
