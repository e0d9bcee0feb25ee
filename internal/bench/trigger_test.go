package bench

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
)

// BenchmarkTrigger is the cost of one trigger through the engine (its
// group commit and store transaction), one at a time: plain; debounced,
// each trigger opening a group of its own (the group's lookup, then the
// insert); and debounced, each merging into one pending task (the lookup
// and the merge's write, no insert). plain-new-key is plain with a
// concurrency key of its own each (a new sub-queue, as each new group of
// debounce-new-group has). SQLite, or the PostgreSQL of
// SLUICE_BENCH_DB: go test ./internal/bench -run '^$' -bench Trigger.
func BenchmarkTrigger(b *testing.B) {
	ctx := b.Context()
	cfg := fairnessConfig().WithDefaults()
	e, err := newEnv(ctx, &cfg, "trig", envOptions{lease: time.Hour})
	require.NoError(b, err)
	defer e.close()
	_, err = e.eng.PutQueue(ctx, "debounced", sluice.QueueParams{
		Debounce: sluice.Set(sluice.Debounce{Period: sluice.Duration(time.Hour), PerKey: true})})
	require.NoError(b, err)
	input := json.RawMessage(`{"doc":7}`)
	for _, c := range []struct {
		name  string
		queue string
		key   func(i int) string
	}{
		{"plain", "plain", func(int) string { return "" }},
		{"plain-new-key", "plain", func(i int) string { return fmt.Sprintf("k%d", i) }},
		{"debounce-new-group", "debounced", func(i int) string { return fmt.Sprintf("k%d", i) }},
		{"debounce-merge", "debounced", func(int) string { return "one" }},
	} {
		b.Run(c.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				_, _, err := e.eng.Trigger(ctx, sluice.TriggerParams{Kind: "echo", Queue: c.queue, ConcurrencyKey: c.key(i), Input: input})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
