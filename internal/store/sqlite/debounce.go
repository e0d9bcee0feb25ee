package sqlite

import (
	"database/sql"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Debounce's I/O (store/debounce.go decides which trigger merges where,
// flow/debounce.go what a merge does to the task): find a group's newest
// task, write a merge, record debounced triggers' idempotency keys, and
// find a key again for a repeat. Mirrors the PostgreSQL store's
// debounce.go. The one writer serialises triggers, so a group's lookup
// and its insert need no lock.

// debounceIO is the store's I/O for store.Debounces.
func (t *txn) debounceIO() store.DebounceIO {
	return store.DebounceIO{
		Queue: func(name string) (*flow.Queue, error) { return t.queue(name, true) },
		Find:  t.debounceFind,
		Merge: t.debounceMerge,
	}
}

func (t *txn) debounceFind(queue, group string) (p flow.Pending, found bool, err error) {
	var until sql.NullInt64
	var triggers sql.NullInt64
	err = t.tx.QueryRowContext(t.ctx, `SELECT id, sq, state, run_at, debounce_until, debounce_triggers FROM tasks INDEXED BY tasks_debounce
		WHERE queue = ? AND debounce_group = ? ORDER BY id DESC LIMIT 1`, queue, group).
		Scan(&p.ID, &p.SQ, &p.State, &p.RunAt, &until, &triggers)
	if err == sql.ErrNoRows {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("debounce: %w", err)
	}
	p.Until, p.Triggers = until.Int64, int(triggers.Int64)
	return p, true, nil
}

func (t *txn) debounceMerge(nt *store.NewTask, p *flow.Pending, to sluice.TaskState, runAt int64) (*sluice.Task, error) {
	if to != p.State {
		q, err := t.queue(nt.Queue, false)
		if err != nil {
			return nil, err
		}
		sq, err := t.subqueue(p.SQ)
		if err != nil {
			return nil, err
		}
		if err := t.Move(sq, q, p.State, to); err != nil {
			return nil, err
		}
	}
	if _, err := t.exec(`UPDATE tasks SET input = ?, state = ?, run_at = ?, debounce_triggers = ? WHERE id = ?`,
		store.JSONOrNull(nt.Input), to, runAt, p.Triggers+1, p.ID); err != nil {
		return nil, fmt.Errorf("debounce: %w", err)
	}
	return getTask(t.ctx, t.tx, p.ID)
}

// debounceKeys records debounced triggers' idempotency keys.
func (t *txn) debounceKeys(keys []store.DebounceKey) error {
	for _, k := range keys {
		if _, err := t.exec(`INSERT INTO debounce_keys (idempotency_key, task_id, input) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`,
			k.Key, k.TaskID, []byte(store.JSONOrNull(k.Input))); err != nil {
			return fmt.Errorf("debounce: %w", err)
		}
	}
	return nil
}

// idempotent finds the task an idempotency key created or, for a
// debounced trigger, the task it was answered with (nil: none), in one
// read of both.
func (t *txn) idempotent(key string) (*sluice.Task, error) {
	var (
		id        int64
		debounced bool
		input     []byte
	)
	err := t.tx.QueryRowContext(t.ctx, `SELECT id, 0, NULL FROM tasks WHERE idempotency_key = ?
		UNION ALL SELECT task_id, 1, input FROM debounce_keys WHERE idempotency_key = ? LIMIT 1`, key, key).Scan(&id, &debounced, &input)
	if err == sql.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency lookup: %w", err)
	}
	task, err := getTask(t.ctx, t.tx, id)
	if err != nil || !debounced {
		return task, err
	}
	return store.DebounceReplay(task, key, input), nil
}
