package flow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// setWeight is what a queue's key_weights write to the sub-queue's row.
func setWeight(sq *flow.Subqueue, w int64) { *sq.Dest()[14].(*int64) = w }

// backlog queues n tasks in sq.
func backlog(t *testing.T, c *flow.Counters, sq *flow.Subqueue, q *flow.Queue, n int64) {
	t.Helper()
	_, err := c.MoveN(sq, q, flow.New, sluice.StateQueued, n)
	require.NoError(t, err)
}

// Ranks: a key of weight w takes Unit/w of fair-queueing time a task, so
// in claim order (by rank) it gets w tasks for each one of weight 1.
func TestFairRanksByWeight(t *testing.T) {
	c := flow.Counters{Env: envRow(0)}
	q := c.UseQueue(queueRow("q", nil, false))
	a, gold := c.UseSubqueue(subqueueRow(1, q, "a")), c.UseSubqueue(subqueueRow(2, q, "gold"))
	setWeight(gold, 4)
	require.Equal(t, int64(4), gold.Weight())
	require.Equal(t, int64(1), a.Weight(), "the default")
	var ranks []int64
	for range 3 {
		r, err := c.MoveN(a, q, flow.New, sluice.StateReady, 1)
		require.NoError(t, err)
		ranks = append(ranks, r)
	}
	require.Equal(t, []int64{flow.Unit, 2 * flow.Unit, 3 * flow.Unit}, ranks)
	ranks = ranks[:0]
	for range 8 {
		r, err := c.MoveN(gold, q, flow.New, sluice.StateReady, 1)
		require.NoError(t, err)
		ranks = append(ranks, r)
	}
	// Eight tasks of weight 4 fit in the time of two of weight 1.
	require.Equal(t, int64(2*flow.Unit), ranks[7])
	// n tasks at once share a rank and move vtime by n steps.
	r, err := c.MoveN(gold, q, flow.New, sluice.StateReady, 4)
	require.NoError(t, err)
	require.Equal(t, int64(2*flow.Unit+flow.Unit/4), r)
	require.Equal(t, int64(3*flow.Unit), gold.VTime())
}

// The refill's turns under an environment limit of one task at a time:
// three backlogged keys of weights 1, 1 and 4 get 1:1:4 of the starts,
// exactly over each round, from the first one on.
func TestFairTurnsShareByWeight(t *testing.T) {
	c := flow.Counters{Env: envRow(1)}
	q := c.UseQueue(queueRow("q", nil, false))
	sqs := []*flow.Subqueue{c.UseSubqueue(subqueueRow(1, q, "a")), c.UseSubqueue(subqueueRow(2, q, "b")), c.UseSubqueue(subqueueRow(3, q, "gold"))}
	setWeight(sqs[2], 4)
	for _, sq := range sqs {
		backlog(t, &c, sq, q, 1000)
	}
	starts := map[string]int{}
	var order []string
	for turn := range 600 {
		turns := flow.NewTurns(sqs, flow.Turn{}, false)
		sq := turns.Next()
		require.NotNil(t, sq)
		n, _, err := c.Promote(sq)
		require.NoError(t, err)
		require.Equal(t, int64(1), n)
		require.False(t, c.Env.HasRoom())
		starts[sq.Key()]++
		if turn < 6 {
			order = append(order, sq.Key())
		}
		// The task runs and ends: the slot is free for the next turn.
		_, err = c.MoveN(nil, nil, sluice.StateReady, sluice.StateRunning, 1)
		require.NoError(t, err)
		_, err = c.MoveN(sq, q, sluice.StateRunning, sluice.StateSucceeded, 1)
		require.NoError(t, err)
		if turn%6 == 5 {
			k := (turn + 1) / 6
			require.Equal(t, map[string]int{"a": k, "b": k, "gold": 4 * k}, starts, "after %d turns", turn+1)
		}
	}
	require.Equal(t, []string{"a", "b", "gold", "gold", "gold", "gold"}, order)
}

// One refill step with room for many: a sub-queue stays first while its
// turn is least (weight 4: four turns running), and one whose turn moves
// past the last sub-queue read leaves the step, since sub-queues not read
// may come before it.
func TestFairTurnsBound(t *testing.T) {
	c := flow.Counters{Env: envRow(100)}
	q := c.UseQueue(queueRow("q", nil, false))
	a, gold := c.UseSubqueue(subqueueRow(1, q, "a")), c.UseSubqueue(subqueueRow(2, q, "gold"))
	setWeight(gold, 4)
	backlog(t, &c, a, q, 10)
	backlog(t, &c, gold, q, 10)
	serve := func(turns *flow.Turns, most int) (keys []string) {
		for range most {
			sq := turns.Next()
			if sq == nil {
				break
			}
			_, _, err := c.Promote(sq)
			require.NoError(t, err)
			keys = append(keys, sq.Key())
		}
		return keys
	}
	// Unbounded (the read came back short: every eligible sub-queue is
	// here): served in turn order until they are empty.
	got := serve(flow.NewTurns([]*flow.Subqueue{gold, a}, flow.Turn{}, false), 100)
	require.Equal(t, []string{"a", "gold", "gold", "gold", "gold", "a", "gold", "gold", "gold", "gold"}, got[:10])
	require.Len(t, got, 20)
	require.Nil(t, flow.NewTurns([]*flow.Subqueue{gold, a}, flow.Turn{}, false).Next(), "nothing eligible is left")

	// Bounded by a read whose last row was a: gold, once past a's turn,
	// waits for the next read.
	backlog(t, &c, a, q, 10)
	backlog(t, &c, gold, q, 10)
	bound := flow.BoundOf(a)
	require.False(t, bound.Before(gold.Turn()), "gold starts within the bound")
	got = serve(flow.NewTurns([]*flow.Subqueue{a, gold}, bound, true), 100)
	require.NotEmpty(t, got)
	require.Less(t, len(got), 20, "the step stopped at the bound")
	for _, sq := range []*flow.Subqueue{a, gold} {
		require.True(t, sq.Eligible())
		require.True(t, bound.Before(sq.Turn()), "%s left the step within the bound", sq.Key())
	}
}
