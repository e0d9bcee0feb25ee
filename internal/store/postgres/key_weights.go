package postgres

import (
	"context"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Key weights, as the SQLite store's key_weights.go: a queue update writes
// them to its sub-queues' weight column, and the queue's answer reads them
// back (store/key_weights.go says how).

// putKeyWeights queues the writes of a queue update's key weights, after
// the queue's row and before its settings are copied to its sub-queues,
// which gives a sub-queue created here the queue's limit and rate limit.
func (t *txn) putKeyWeights(queue string, u store.KeyWeightUpdate) {
	if u.Clear {
		t.exec("writing key weights", `UPDATE subqueues SET weight = 1 WHERE queue = $1 AND weight <> 1`, queue)
		return
	}
	if len(u.Reset) > 0 {
		t.exec("writing key weights", `UPDATE subqueues SET weight = 1 WHERE queue = $1 AND weight <> 1 AND ckey = ANY($2::text[])`, queue, u.Reset)
	}
	if len(u.Keys) > 0 {
		t.exec("writing key weights", `INSERT INTO subqueues (queue, ckey, paused, weight)
			SELECT q.name, v.ckey, q.paused, v.weight FROM queues q, unnest($2::text[], $3::bigint[]) AS v(ckey, weight) WHERE q.name = $1
			ON CONFLICT (queue, ckey) DO UPDATE SET weight = excluded.weight`, queue, u.Keys, u.Weights)
	}
}

// addKeyWeights reads the weighed keys of qs (one queue: name; else all).
func (s *Store) addKeyWeights(ctx context.Context, name string, qs ...*sluice.Queue) error {
	if name != "" {
		return store.AddKeyWeights(ctx, s.reader(), store.KeyWeightsSQL+` AND queue = $1`, []any{name}, qs...)
	}
	return store.AddKeyWeights(ctx, s.reader(), store.KeyWeightsSQL, nil, qs...)
}
