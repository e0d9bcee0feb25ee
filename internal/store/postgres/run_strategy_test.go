package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/flow"
	"github.com/sluice-dev/sluice/internal/store/pgtest"
	"github.com/sluice-dev/sluice/internal/store/postgres"
)

// Two replicas start a run of one key (limit 1) at the same moment, for
// a fresh key each round: the run strategy decides on what the first
// writer left (S-WF10). Under cancel_newest exactly one run is created
// and the other start is refused; under cancel_in_progress both are
// created, the later cancels the earlier, and the key holds one place.
func TestPostgresRunStrategyReplicas(t *testing.T) {
	pgtest.BaseURL(t)
	t.Parallel()
	for _, strategy := range []string{flow.StrategyCancelNewest, flow.StrategyCancelInProgress} {
		t.Run(strategy, func(t *testing.T) {
			t.Parallel()
			a, b := newReplicas(t)
			ctx := context.Background()
			const rounds = 20
			for round := range rounds {
				key := fmt.Sprint("k", round)
				var (
					wg    sync.WaitGroup
					start = make(chan struct{})
					runs  [2]*store.RunRecord
					errs  [2]error
				)
				for i, st := range []store.Store{a, b} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						runs[i], _, _, errs[i] = st.CreateRun(ctx, store.Limits{},
							store.NewRun{Workflow: "wf", Version: 1, Limit: 1, Key: key, Strategy: strategy})
					}()
				}
				close(start)
				wg.Wait()

				var ofKey []sluice.Run
				all, err := a.ListRuns(ctx, sluice.RunFilter{Workflow: "wf", Limit: 1000}, 0)
				require.NoError(t, err)
				for _, r := range all {
					if r.ConcurrencyKey == key {
						ofKey = append(ofKey, r)
					}
				}
				switch strategy {
				case flow.StrategyCancelNewest:
					refused := 0
					for _, err := range errs {
						if err != nil {
							require.ErrorIs(t, err, sluice.ErrConcurrencyFull, "round %d", round)
							refused++
						}
					}
					require.Equal(t, 1, refused, "round %d: one start is refused", round)
					require.Len(t, ofKey, 1, "round %d: one run created", round)
					require.Equal(t, sluice.RunRunning, ofKey[0].State)
				case flow.StrategyCancelInProgress:
					require.NoError(t, errs[0], "round %d", round)
					require.NoError(t, errs[1], "round %d", round)
					require.Len(t, ofKey, 2, "round %d: both created", round)
					// Newest first: the later run replaced the earlier.
					require.Equal(t, sluice.RunRunning, ofKey[0].State, "round %d", round)
					require.Equal(t, sluice.RunCancelled, ofKey[1].State, "round %d", round)
					require.Equal(t, store.RunReplacedError(ofKey[0].ID), ofKey[1].Error, "round %d", round)
				}
				var active int64
				require.NoError(t, a.(*postgres.Store).Pool().QueryRow(ctx,
					`SELECT active FROM run_slots WHERE workflow = 'wf' AND ckey = $1`, key).Scan(&active))
				require.EqualValues(t, 1, active, "round %d: the key holds one place", round)
			}
			bad, err := b.CheckCounters(ctx)
			require.NoError(t, err)
			require.Empty(t, bad)
		})
	}
}
