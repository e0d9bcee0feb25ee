package store

import (
	"context"
	"fmt"
	"slices"

	"github.com/sluice-dev/sluice"
)

// Key weights (QueueParams.KeyWeights; flow/fair.go). A key's weight is
// its sub-queue's column, weight: the source of truth, which the refill
// and the claims read with the rest of the row. Setting a weight other
// than 1 for a key that has no sub-queue yet creates it (empty, with the
// queue's settings, as a trigger would); weight 1 is the column's default,
// so restoring it only updates sub-queues that exist. The queue's answer
// lists the keys whose weight is not 1 (the partial index
// subqueues_weighted).

// KeyWeightUpdate is what a queue update does to its keys' weights: the
// keys to set (weight ≠ 1) and the keys back to 1, each in key order; or,
// with Clear, every key back to 1 (key_weights: null).
type KeyWeightUpdate struct {
	Clear   bool
	Keys    []string
	Weights []int64
	Reset   []string
}

// KeyWeightsOf reads the update of p's key_weights (ok false: none sent).
func KeyWeightsOf(p sluice.QueueParams) (u KeyWeightUpdate, ok bool) {
	if !p.KeyWeights.Present {
		return u, false
	}
	if p.KeyWeights.Value == nil {
		return KeyWeightUpdate{Clear: true}, true
	}
	w := *p.KeyWeights.Value
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if w[k] == 1 {
			u.Reset = append(u.Reset, k)
		} else {
			u.Keys, u.Weights = append(u.Keys, k), append(u.Weights, int64(w[k]))
		}
	}
	return u, true
}

// KeyWeightsSQL lists the weighed keys of every queue (queue, ckey,
// weight): the rows AddKeyWeights reads. With a queue named, the store
// adds its condition.
const KeyWeightsSQL = `SELECT queue, ckey, weight FROM subqueues WHERE weight <> 1`

// AddKeyWeights reads the weighed keys of the queues qs (sql: rows of
// queue, ckey, weight; args its parameters) into their KeyWeights, and
// gives every queue of qs a map, empty if it has none.
func AddKeyWeights(ctx context.Context, r Reader, sql string, args []any, qs ...*sluice.Queue) error {
	byName := make(map[string]*sluice.Queue, len(qs))
	for _, q := range qs {
		q.KeyWeights = sluice.KeyWeights{}
		byName[q.Name] = q
	}
	rows, done, err := r.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("reading key weights: %w", err)
	}
	defer done()
	for rows.Next() {
		var queue, key string
		var w int
		if err := rows.Scan(&queue, &key, &w); err != nil {
			return fmt.Errorf("reading key weights: %w", err)
		}
		if q := byName[queue]; q != nil {
			q.KeyWeights[key] = w
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading key weights: %w", err)
	}
	return nil
}
