package flow

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A recount changes only the counters that differ, says which, and marks
// the row for writing only then.
func TestRecount(t *testing.T) {
	sq := &Subqueue{running: 3, queued: 2, lent: 1}
	require.Empty(t, sq.Recount(3, 2, 1))
	require.False(t, sq.dirty)
	require.Equal(t, []Change{{"running", 3, 1}, {"lent", 1, 0}}, sq.Recount(1, 2, 0))
	require.True(t, sq.dirty)
	require.Equal(t, int64(1), sq.Running())
	require.Equal(t, int64(0), sq.Lent())

	e := &Env{running: 5, active: 9, lane: 0}
	require.Equal(t, []Change{{"active", 9, 7}, {"lane", 0, 2}}, e.Recount(5, 7, 2))
	require.True(t, e.dirty)

	q := &Queue{active: 4}
	require.Empty(t, q.Recount(4))
	require.False(t, q.dirty)
	require.Equal(t, []Change{{"active", 4, 0}}, q.Recount(0))
	require.True(t, q.dirty)

	st := &Step{active: 2, waiting: 3, remaining: 5}
	require.Equal(t, []Change{{"waiting", 3, 1}, {"remaining", 5, 3}}, st.Recount(2, 1, 3))
	require.True(t, st.Dirty())
	require.Equal(t, int64(1), st.Waiting())
}
