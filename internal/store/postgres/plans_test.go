package postgres_test

import (
	"context"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/storetest"
)

// writeStatements records the statements a store sends in its write
// transactions (the batches; reads go through Query on their own), with
// how many parameters each takes, and which conformance tests ran.
type writeStatements struct {
	mu    sync.Mutex
	args  map[string]int
	ended map[string]bool // conformance tests, by name, that ran to the end
}

func newWriteStatements() *writeStatements {
	return &writeStatements{args: map[string]int{}, ended: map[string]bool{}}
}

// suiteWrites records TestPostgresConformance's statements, for
// TestPostgresGenericPlans.
var suiteWrites = newWriteStatements()

// end records that the conformance test t ran to the end. t may be a
// subtest of the suite's test (ChildWaitModel/1): each name below the
// top-level test's counts, or a suite whose tests open their stores in
// subtests would never look whole and TestPostgresGenericPlans would run
// it all again.
func (w *writeStatements) end(t *testing.T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, name := range strings.Split(t.Name(), "/")[1:] {
		w.ended[name] = true
	}
}

// whole says whether every test of the suite ran to the end: the
// statements are all the suite sends.
func (w *writeStatements) whole() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, name := range storetest.Names() {
		if !w.ended[name] {
			return false
		}
	}
	return true
}

func (w *writeStatements) statements() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.args)
}

func (w *writeStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (w *writeStatements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (w *writeStatements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (w *writeStatements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.args[d.SQL] = len(d.Args)
}
func (w *writeStatements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

var (
	dml     = regexp.MustCompile(`^\s*(?i:select|with|insert|update|delete)\b`)
	seqScan = regexp.MustCompile(`Seq Scan on (tasks|attempts)\b`)
	// indexScan names the index of an index scan on tasks or attempts.
	indexScan = regexp.MustCompile(`Index (?:Only )?Scan (?:Backward )?using (\w+) on (?:tasks|attempts)\b`)
)

// Every statement the conformance suite's write transactions send,
// prepared in a schema of 20,000 tasks, must have a generic plan that
// reads tasks and attempts through indexes only. Write transactions run
// on generic plans (planned once per connection, not at each execution),
// and a generic plan knows neither the batch sizes nor the limits: a join
// costed for a guessed number of rows became a hash join over a
// sequential scan of every task (the claim took 16 ms with 10,000 tasks
// blocked, 27 ms with 100,000).
//
// The statements are those TestPostgresConformance recorded: a parallel
// test starts only once every test that is not has ended. Where that run
// did not cover the whole suite (go test -run), the suite runs here.
func TestPostgresGenericPlans(t *testing.T) {
	pgtest.BaseURL(t)
	t.Parallel()
	writes := suiteWrites
	if !writes.whole() {
		writes = newWriteStatements()
		t.Run("suite", func(t *testing.T) { storetest.Run(t, newStore(writes)) })
		if t.Failed() {
			return
		}
	}
	checkGenericPlans(t, writes.statements())
}

// fullIndexScans returns the scans of an index on tasks or attempts in an
// EXPLAIN plan that have no Index Cond: a partial index whose predicate
// the query implies, read from end to end with the query's conditions as
// a filter. With statistics that saw the index empty, a generic plan
// costs such a scan the same as a probe; once the index fills, each
// execution reads all of it (and, in a nested loop, once per outer row).
func fullIndexScans(plan []string) []string {
	var out []string
	for i, line := range plan {
		m := indexScan.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		probed := false
		for _, next := range plan[i+1:] {
			if len(next)-len(strings.TrimLeft(next, " ")) <= indent || strings.Contains(next, "->") {
				break
			}
			if strings.Contains(next, "Index Cond:") {
				probed = true
			}
		}
		// Reading an index in order up to a Limit, with nothing to
		// filter out, is how min() and "the oldest first" are served.
		if !probed && !(underLimit(plan[:i]) && !filtered(plan[i+1:], indent)) {
			out = append(out, m[1])
		}
	}
	return out
}

// underLimit says whether the plan node just above the last line of plan
// (the node being looked at) is a Limit.
func underLimit(above []string) bool {
	for i := len(above) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(above[i]); strings.HasPrefix(l, "->") || i == 0 {
			return strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(l, "->")), "Limit")
		}
	}
	return false
}

// filtered says whether the node at indent has a Filter line (the lines
// of plan below it, up to its first child or sibling).
func filtered(below []string, indent int) bool {
	for _, next := range below {
		if len(next)-len(strings.TrimLeft(next, " ")) <= indent || strings.Contains(next, "->") {
			return false
		}
		if strings.Contains(next, "Filter:") {
			return true
		}
	}
	return false
}

func checkGenericPlans(t *testing.T, statements map[string]int) {
	ctx := context.Background()
	st := open(t, pgtest.URL(t))
	_, err := st.Migrate(ctx)
	require.NoError(t, err)
	conn, err := st.Pool().Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `INSERT INTO tasks (kind, queue, sq, state, max_attempts, run_at, created_at, worker_id, finished_at)
		SELECT 'k', 'q', 1 + i % 50, s, 3, 0, 0, CASE WHEN s = 'running' THEN 'w' END, CASE WHEN s = 'succeeded' THEN i END
		FROM generate_series(1, 20000) AS i, LATERAL (SELECT (ARRAY['succeeded', 'queued', 'ready', 'running'])[1 + i % 4] AS s) x`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO attempts (task_id, attempt, worker_id, started_at, finished_at, state)
		SELECT id, 1, 'w', 0, 0, 'succeeded' FROM tasks WHERE state = 'succeeded'`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `ANALYZE`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)

	checked := 0
	for _, sql := range slices.Sorted(maps.Keys(statements)) {
		if !dml.MatchString(sql) {
			continue
		}
		_, err := conn.Exec(ctx, "PREPARE generic_plan AS "+sql)
		require.NoError(t, err, sql)
		nulls := strings.TrimSuffix(strings.Repeat("NULL, ", statements[sql]), ", ")
		if nulls != "" {
			nulls = "(" + nulls + ")"
		}
		rows, err := conn.Query(ctx, "EXPLAIN EXECUTE generic_plan"+nulls)
		require.NoError(t, err, sql)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, sql)
		plan := strings.Join(lines, "\n")
		require.False(t, seqScan.MatchString(plan), "a generic plan reads every task:\n%s\n%s", sql, plan)
		for _, scan := range fullIndexScans(lines) {
			t.Errorf("a generic plan reads a whole index (%s), filtering what it reads:\n%s\n%s", scan, sql, plan)
		}
		_, err = conn.Exec(ctx, "DEALLOCATE generic_plan")
		require.NoError(t, err)
		checked++
	}
	// The suite's write transactions: claims, completions, promotions,
	// hand-overs, sweeps, queue and task changes.
	require.Greater(t, checked, 30, "statements checked")
	t.Logf("the generic plans of %d statements checked", checked)
}
