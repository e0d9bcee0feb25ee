package engine_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// A step's rate_limit is its queue's: applying the workflow sets it on
// the queue (leaving the queue's other settings alone), and a queue that
// cannot take it refuses the upload, naming the field.
func TestApplyWorkflowSetsStepRateLimit(t *testing.T) {
	f := newFixture(t, engine.Config{})
	f.putQueue("api", 4)
	_, err := f.e.ApplyWorkflow(f.ctx, []byte(`
name: sync
steps:
  - {name: fetch, kind: call, queue: api, concurrency_key: '${{ input.tenant }}', rate_limit: {limit: 100, period: 1m, per_key: true}}
  - {name: store, kind: save}
`), "application/yaml")
	require.NoError(t, err)
	q, err := f.e.GetQueue(f.ctx, "api")
	require.NoError(t, err)
	require.Equal(t, &sluice.RateLimit{Limit: 100, Period: sluice.Duration(time.Minute), PerKey: true}, q.RateLimit)
	require.Equal(t, 4, *q.ConcurrencyLimit, "the queue's limit stays")

	_, err = f.e.PutQueue(f.ctx, "chained", sluice.QueueParams{ConcurrencyLimit: sluice.Set(1), Handover: sluice.Set(true)})
	require.NoError(t, err)
	_, err = f.e.ApplyWorkflow(f.ctx, []byte(`
name: other
steps:
  - {name: a, kind: call, queue: chained, rate_limit: 5/1s}
`), "application/yaml")
	var se *sluice.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, "rate_limit", se.Field)
	require.Contains(t, se.Message, `queue "chained"`)
	_, err = f.e.GetWorkflow(f.ctx, "other", 0)
	require.ErrorIs(t, err, sluice.ErrNotFound, "a refused upload stores nothing")
}
