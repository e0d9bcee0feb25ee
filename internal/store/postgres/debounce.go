package postgres

import (
	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Debounce's I/O, as in the SQLite store's debounce.go. Two triggers of
// one group on two replicas are serialised by their queue's lock (a
// shared write locks the queues it enqueues to; an exclusive one runs
// alone); the group's task is read FOR UPDATE, so that a claim, which
// does not lock the queue, either took it before (the trigger sees it
// running and makes a new task) or waits for the merge.

// debounceIO is the store's I/O for store.Debounces.
func (t *txn) debounceIO() store.DebounceIO {
	return store.DebounceIO{
		Queue: func(name string) (*flow.Queue, error) { return t.queue(name, true) },
		Find:  t.debounceFind,
		Merge: t.debounceMerge,
	}
}

func (t *txn) debounceFind(queue, group string) (p flow.Pending, found bool, err error) {
	var until, triggers *int64
	var state string
	found, err = t.queryRow("debounce", `SELECT id, sq, state, run_at, debounce_until, debounce_triggers FROM tasks
		WHERE queue = $1 AND debounce_group = $2 ORDER BY id DESC LIMIT 1 FOR UPDATE`, []any{queue, group},
		&p.ID, &p.SQ, &state, &p.RunAt, &until, &triggers)
	p.State = sluice.TaskState(state)
	if until != nil {
		p.Until = *until
	}
	if triggers != nil {
		p.Triggers = int(*triggers)
	}
	return p, found, err
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
	t.exec("debounce", `UPDATE tasks SET input = $2, state = $3, run_at = $4, debounce_triggers = $5 WHERE id = $1`,
		p.ID, store.JSONOrNull(nt.Input), string(to), runAt, p.Triggers+1)
	if err := t.send(); err != nil {
		return nil, err
	}
	return getTask(t.ctx, t.conn, p.ID)
}

// debounceKeys records debounced triggers' idempotency keys.
func (t *txn) debounceKeys(keys []store.DebounceKey) {
	if len(keys) == 0 {
		return
	}
	var (
		names   []string
		taskIDs []int64
		inputs  [][]byte
	)
	for _, k := range keys {
		names, taskIDs, inputs = append(names, k.Key), append(taskIDs, k.TaskID), append(inputs, store.JSONOrNull(k.Input))
	}
	t.exec("debounce", `INSERT INTO debounce_keys (idempotency_key, task_id, input)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[]) ON CONFLICT DO NOTHING`, names, taskIDs, inputs)
}
