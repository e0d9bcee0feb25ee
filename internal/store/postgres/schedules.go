package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Cron schedules: the schedules of each workflow's latest version, when
// each fires next, and the firing itself (a run and the next firing, in
// one transaction, checked against the firing it was due for). Mirrors
// the SQLite store's schedules.go.
//
// Writes hold the env lock, as every write does; the compare-and-set on
// next_at is what makes one firing start one run whichever replica
// fires it.

const scheduleSQL = `SELECT ` + store.ScheduleCols + ` FROM schedules`

// SetSchedules replaces a workflow's schedules; see store.ScheduleStore.
// One statement for all of them, with the COMMIT.
func (s *Store) SetSchedules(ctx context.Context, workflow string, version int, list []store.NewSchedule) error {
	return s.run(ctx, nil, func(t *txn) error {
		t.exec("schedules of "+workflow, `DELETE FROM schedules WHERE workflow = $1 AND idx >= $2`, workflow, len(list))
		if len(list) == 0 {
			return nil
		}
		crons, inputs, nexts := make([]string, len(list)), make([][]byte, len(list)), make([]int64, len(list))
		for i, ns := range list {
			crons[i], inputs[i], nexts[i] = ns.Cron, store.JSONOrNull(ns.Input), store.US(ns.NextAt)
		}
		// Unchanged (same cron, same input): keeps its next firing.
		t.exec("schedules of "+workflow, `INSERT INTO schedules (workflow, idx, version, cron, input, next_at, created_at)
			SELECT $1, v.o - 1, $2, v.cron, v.input, v.next_at, $6
			FROM unnest($3::text[], $4::bytea[], $5::bigint[]) WITH ORDINALITY AS v(cron, input, next_at, o)
			ON CONFLICT (workflow, idx) DO UPDATE SET version = excluded.version,
				next_at = CASE WHEN schedules.cron = excluded.cron AND schedules.input = excluded.input THEN schedules.next_at ELSE excluded.next_at END,
				cron = excluded.cron, input = excluded.input`,
			workflow, version, crons, inputs, nexts, t.now)
		return nil
	})
}

// ListSchedules returns every schedule.
func (s *Store) ListSchedules(ctx context.Context) ([]store.Schedule, error) {
	return store.ReadSchedules(ctx, s.reader(), scheduleSQL+` ORDER BY workflow COLLATE "C", idx`)
}

// SetSchedulePaused pauses or resumes a schedule.
func (s *Store) SetSchedulePaused(ctx context.Context, id int64, paused bool, next time.Time) (*store.Schedule, error) {
	var found bool
	err := s.run(ctx, nil, func(t *txn) error {
		q, args := `UPDATE schedules SET paused = true WHERE id = $1 RETURNING id`, []any{id}
		if !paused {
			q, args = `UPDATE schedules SET paused = false, next_at = CASE WHEN paused THEN $2 ELSE next_at END WHERE id = $1 RETURNING id`,
				[]any{id, store.US(next)}
		}
		var got int64
		var err error
		found, err = t.queryRow(fmt.Sprintf("schedule %d", id), q, args, &got)
		if err != nil {
			return err
		}
		if !found {
			return sluice.NotFound("schedule %d not found", id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	list, err := store.ReadSchedules(ctx, s.reader(), scheduleSQL+` WHERE id = $1`, id)
	if err != nil || len(list) == 0 {
		return nil, fmt.Errorf("schedule %d: %w", id, err)
	}
	return &list[0], nil
}

// DueSchedules returns the schedules due now and the next firing of the
// others.
func (s *Store) DueSchedules(ctx context.Context, limit int) ([]store.Schedule, time.Time, error) {
	now := store.US(s.now())
	due, err := store.ReadSchedules(ctx, s.reader(), scheduleSQL+` WHERE NOT paused AND next_at <= $1 ORDER BY next_at LIMIT $2`, now, limit)
	if err != nil {
		return nil, time.Time{}, err
	}
	var next *int64
	if err := s.pool.QueryRow(ctx, `SELECT min(next_at) FROM schedules WHERE NOT paused AND next_at > $1`, now).Scan(&next); err != nil {
		return nil, time.Time{}, fmt.Errorf("reading schedules: %w", err)
	}
	var at time.Time
	if next != nil {
		at = store.FromUS(*next)
	}
	return due, at, nil
}

// FireSchedule starts a schedule's run and moves its next firing on.
func (s *Store) FireSchedule(ctx context.Context, lim store.Limits, id int64, due, next time.Time, r store.NewRun) (*store.RunRecord, store.Outcome, error) {
	var runID int64
	o, err := s.write(ctx, func(t *txn) error {
		if err := t.moveSchedule(id, due, next); err != nil {
			return err
		}
		var err error
		if runID, _, err = t.createRun(lim, r); err != nil {
			return err
		}
		t.exec(fmt.Sprintf("schedule %d", id), `UPDATE schedules SET last_run_id = $1, last_at = $2 WHERE id = $3`, runID, t.now, id)
		return nil
	})
	if err != nil {
		return nil, o, err
	}
	run, err := s.GetRun(ctx, runID)
	return run, o, err
}

// SkipSchedule moves a due firing on without a run.
func (s *Store) SkipSchedule(ctx context.Context, id int64, due, next time.Time) error {
	_, err := s.write(ctx, func(t *txn) error { return t.moveSchedule(id, due, next) })
	return err
}

// moveSchedule moves schedule id's next firing from due to next, or
// answers ErrScheduleFired if it is no longer due.
func (t *txn) moveSchedule(id int64, due, next time.Time) error {
	var got int64
	found, err := t.queryRow(fmt.Sprintf("schedule %d", id), `UPDATE schedules SET next_at = $1 WHERE id = $2 AND next_at = $3 AND NOT paused RETURNING id`,
		[]any{store.US(next), id, store.US(due)}, &got)
	if err != nil {
		return err
	}
	if !found {
		return store.ErrScheduleFired
	}
	return nil
}
