package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
)

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	Type           string     `json:"Node Type"`
	Relation       string     `json:"Relation Name"`
	Rows           float64    `json:"Actual Rows"`
	Loops          float64    `json:"Actual Loops"`
	Removed        float64    `json:"Rows Removed by Filter"`
	JoinRemoved    float64    `json:"Rows Removed by Join Filter"`
	RecheckRemoved float64    `json:"Rows Removed by Index Recheck"`
	Plans          []planNode `json:"Plans"`
}

// tasksRead is how many rows of tasks the plan read: what each scan of
// tasks returned or filtered out, in every loop, and the pairs joins
// compared and threw away (a join filter instead of a probe).
func (n planNode) tasksRead() float64 {
	var read float64
	if n.Relation == "tasks" {
		read += (n.Rows + n.Removed + n.RecheckRemoved) * n.Loops
	}
	read += n.JoinRemoved * n.Loops
	for _, c := range n.Plans {
		read += c.tasksRead()
	}
	return read
}

// explainRead runs sql on a generic plan, as write transactions do, with
// EXPLAIN ANALYZE in a transaction it rolls back, and returns the rows of
// tasks it read.
func explainRead(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string, args ...any) float64 {
	t.Helper()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() {
		_ = tx.Rollback(ctx)
		_, _ = conn.Exec(ctx, "DEALLOCATE read_check") // PREPARE outlives the transaction
	}()
	_, err = tx.Exec(ctx, setGenericPlans)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "PREPARE read_check AS "+sql)
	require.NoError(t, err, sql)
	params := ""
	for i := range args {
		if i > 0 {
			params += ", "
		}
		params += fmt.Sprintf("$%d", i+1)
	}
	if params != "" {
		params = "(" + params + ")"
	}
	var out []byte
	require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE read_check"+params, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...).Scan(&out), sql)
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if testing.Verbose() && os.Getenv("SHOWPLAN") != "" {
		t.Log(string(out))
	}
	require.NoError(t, json.Unmarshal(out, &plans))
	require.Len(t, plans, 1)
	return plans[0].Plan.tasksRead()
}

// The statements of the hand-over path read what they touch, on the
// generic plans write transactions use, while statistics lag (taken when
// no task was reserved): a worker runs n tasks, each with a chain of two
// reserved successors, and each statement works on all of them. Written
// as joins with their checks, these statements read all of the worker's
// reserved tasks once per task (a hand-over of 99 took 16 ms, 19,701 rows
// compared, seen with auto_explain during a benchmark); here each must
// read a few rows per task.
func TestPostgresHandoverReadsScale(t *testing.T) {
	const n = 200
	ctx := context.Background()
	st, err := Open(ctx, pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	limit := n
	_, _, err = st.PutQueue(ctx, "hq", sluice.QueueParams{ConcurrencyLimit: sluice.Set(limit), Handover: sluice.Set(true)})
	require.NoError(t, err)
	nts := make([]store.NewTask, 4*n)
	for i := range nts {
		nts[i] = store.NewTask{Kind: "hq", Queue: "hq", MaxAttempts: 3}
	}
	_, _, err = st.Enqueue(ctx, store.Limits{}, nts)
	require.NoError(t, err)
	// Other tasks, so that reading the table is dearer than probing it.
	for range 4 {
		others := make([]store.NewTask, 5000)
		for i := range others {
			others[i] = store.NewTask{Kind: "other", Queue: "other", MaxAttempts: 3}
		}
		_, _, err = st.Enqueue(ctx, store.Limits{}, others)
		require.NoError(t, err)
	}
	require.NoError(t, st.RegisterWorker(ctx, store.Worker{ID: "w", Name: "w", Kinds: []string{"hq"}, Slots: 10 * n, Lease: time.Minute, Handover: true}))
	conn, err := st.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "ANALYZE")
	require.NoError(t, err)

	got, err := st.Claim(ctx, "w", 10*n, time.Minute, 0)
	require.NoError(t, err)
	next := map[int64]int64{} // predecessor → its first successor
	var running, reserved, ps, ss, ats []int64
	for _, c := range got {
		if c.After == 0 {
			running = append(running, c.ID)
			continue
		}
		reserved = append(reserved, c.ID)
		next[c.After] = c.ID
	}
	require.Len(t, running, n)
	require.Len(t, reserved, 2*n)
	for _, p := range running {
		ps, ss, ats = append(ps, p), append(ss, next[p]), append(ats, 0)
	}
	// Top each chain up by one, from the same sub-queue: the last n
	// tasks queued.
	var sq int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT id FROM subqueues WHERE queue = 'hq'`).Scan(&sq))
	var tails, sqs, offs, ones []int64
	for i, p := range running {
		tails, sqs, offs, ones = append(tails, next[next[p]]), append(sqs, sq), append(offs, int64(i)), append(ones, 1)
	}
	states := make([]string, len(reserved))
	for i := range states {
		states[i] = "queued"
	}

	for _, c := range []struct {
		name  string
		sql   string
		args  []any
		tasks int // the tasks it works on
	}{
		{"hand-over", handOverSQL, []any{ats, ps, ss, "w"}, n},
		{"running tasks with their chains", runningSelect(`t.state = 'running' AND t.worker_id = $1`), []any{"w"}, 3 * n},
		{"reserved tasks with their chains", reservedSelect(`r.after_id = ANY($1)`), []any{running}, 2 * n},
		{"reserving after each chain's tail", reserveSQL, []any{tails, sqs, offs, "w", int64(1), n, ones}, n},
		{"release of reserved tasks", unreserveSQL, []any{reserved, len(reserved), states}, 2 * n},
		{"release of a few reserved tasks", unreserveSQL, []any{reserved[:10], 10, states[:10]}, 10},
	} {
		read := explainRead(t, ctx, conn.Conn(), c.sql, c.args...)
		t.Logf("%s: %.0f rows of tasks read for %d tasks", c.name, read, c.tasks)
		require.LessOrEqual(t, read, float64(6*c.tasks), "%s reads rows of tasks out of proportion to the %d tasks it works on", c.name, c.tasks)
	}
}
