package sqlite

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Key weights: a queue update writes them to its sub-queues' weight
// column, and the queue's answer reads them back (store/key_weights.go
// says how). Mirrors the PostgreSQL store's key_weights.go.

// putKeyWeights writes a queue update's key weights, after the queue's
// row and before its settings are copied to its sub-queues (setSubqueues),
// which gives a sub-queue created here the queue's limit and rate limit.
func (t *txn) putKeyWeights(queue string, u store.KeyWeightUpdate) error {
	if u.Clear {
		if _, err := t.exec(`UPDATE subqueues SET weight = 1 WHERE queue = ? AND weight <> 1`, queue); err != nil {
			return fmt.Errorf("writing key weights: %w", err)
		}
		return nil
	}
	if len(u.Reset) > 0 {
		keys, _ := json.Marshal(u.Reset)
		if _, err := t.exec(`UPDATE subqueues SET weight = 1 WHERE queue = ? AND weight <> 1 AND ckey IN (SELECT value FROM json_each(?))`,
			queue, string(keys)); err != nil {
			return fmt.Errorf("writing key weights: %w", err)
		}
	}
	if len(u.Keys) > 0 {
		set := make(map[string]int64, len(u.Keys))
		for i, k := range u.Keys {
			set[k] = u.Weights[i]
		}
		obj, _ := json.Marshal(set)
		if _, err := t.exec(`INSERT INTO subqueues (queue, ckey, paused, weight)
			SELECT q.name, j.key, q.paused, j.value FROM queues q, json_each(?) j WHERE q.name = ?
			ON CONFLICT (queue, ckey) DO UPDATE SET weight = excluded.weight`, string(obj), queue); err != nil {
			return fmt.Errorf("writing key weights: %w", err)
		}
	}
	return nil
}

// addKeyWeights reads the weighed keys of qs (one queue: name; else all).
func (s *Store) addKeyWeights(ctx context.Context, name string, qs ...*sluice.Queue) error {
	if name != "" {
		return store.AddKeyWeights(ctx, s.reader(), store.KeyWeightsSQL+` AND queue = ?`, []any{name}, qs...)
	}
	return store.AddKeyWeights(ctx, s.reader(), store.KeyWeightsSQL, nil, qs...)
}
