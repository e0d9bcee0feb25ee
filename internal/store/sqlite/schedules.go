package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Cron schedules: the schedules of each workflow's latest version, when
// each fires next, and the firing itself (a run and the next firing, in
// one transaction, checked against the firing it was due for). Mirrors
// the PostgreSQL store's schedules.go.

const scheduleSQL = `SELECT ` + store.ScheduleCols + ` FROM schedules`

// SetSchedules replaces a workflow's schedules; see store.ScheduleStore.
func (s *Store) SetSchedules(ctx context.Context, workflow string, version int, list []store.NewSchedule) error {
	return s.tx(ctx, func(tx *wtx) error {
		now := store.US(s.now())
		if _, err := tx.ExecContext(ctx, `DELETE FROM schedules WHERE workflow = ? AND idx >= ?`, workflow, len(list)); err != nil {
			return fmt.Errorf("schedules of %q: %w", workflow, err)
		}
		for i, ns := range list {
			// Unchanged (same cron, same input): keeps its next firing.
			_, err := tx.ExecContext(ctx, `INSERT INTO schedules (workflow, idx, version, cron, input, next_at, created_at)
				VALUES (?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (workflow, idx) DO UPDATE SET version = excluded.version,
					next_at = CASE WHEN schedules.cron = excluded.cron AND schedules.input = excluded.input THEN schedules.next_at ELSE excluded.next_at END,
					cron = excluded.cron, input = excluded.input`,
				workflow, i, version, ns.Cron, []byte(store.JSONOrNull(ns.Input)), store.US(ns.NextAt), now)
			if err != nil {
				return fmt.Errorf("schedules of %q: %w", workflow, err)
			}
		}
		return nil
	})
}

// ListSchedules returns every schedule.
func (s *Store) ListSchedules(ctx context.Context) ([]store.Schedule, error) {
	return store.ReadSchedules(ctx, s.reader(), scheduleSQL+` ORDER BY workflow, idx`)
}

// SetSchedulePaused pauses or resumes a schedule.
func (s *Store) SetSchedulePaused(ctx context.Context, id int64, paused bool, next time.Time) (*store.Schedule, error) {
	err := s.tx(ctx, func(tx *wtx) error {
		q, args := `UPDATE schedules SET paused = 1 WHERE id = ?`, []any{id}
		if !paused {
			q, args = `UPDATE schedules SET paused = 0, next_at = CASE WHEN paused = 1 THEN ? ELSE next_at END WHERE id = ?`, []any{store.US(next), id}
		}
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("schedule %d: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return sluice.NotFound("schedule %d not found", id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	list, err := store.ReadSchedules(ctx, reader{s.w}, scheduleSQL+` WHERE id = ?`, id)
	if err != nil || len(list) == 0 {
		return nil, fmt.Errorf("schedule %d: %w", id, err)
	}
	return &list[0], nil
}

// DueSchedules returns the schedules due now and the next firing of the
// others.
func (s *Store) DueSchedules(ctx context.Context, limit int) ([]store.Schedule, time.Time, error) {
	now := store.US(s.now())
	due, err := store.ReadSchedules(ctx, s.reader(), scheduleSQL+` WHERE paused = 0 AND next_at <= ? ORDER BY next_at LIMIT ?`, now, limit)
	if err != nil {
		return nil, time.Time{}, err
	}
	var next sql.NullInt64
	if err := s.r.QueryRowContext(ctx, `SELECT min(next_at) FROM schedules WHERE paused = 0 AND next_at > ?`, now).Scan(&next); err != nil {
		return nil, time.Time{}, fmt.Errorf("reading schedules: %w", err)
	}
	var at time.Time
	if next.Valid {
		at = store.FromUS(next.Int64)
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
		_, err = t.exec(`UPDATE schedules SET last_run_id = ?, last_at = ? WHERE id = ?`, runID, t.now, id)
		return err
	})
	if err != nil {
		return nil, o, err
	}
	run, err := s.getRun(ctx, s.w, runID)
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
	res, err := t.exec(`UPDATE schedules SET next_at = ? WHERE id = ? AND next_at = ? AND paused = 0`, store.US(next), id, store.US(due))
	if err != nil {
		return fmt.Errorf("schedule %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrScheduleFired
	}
	return nil
}
