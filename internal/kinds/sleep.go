package kinds

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice"
)

type sleepInput struct {
	Duration *string `json:"duration"`
}

// sleepHandler waits for input.duration, or until the task is cancelled.
// Output: {"slept": "1.5s", "took_us": 1500412}: the duration asked for,
// and the wait as the handler measured it (benchmarks use it for the work
// actually done). The wait ends within tens of microseconds of the
// duration on Linux (precise.go), within a millisecond or so elsewhere.
func sleepHandler(ctx context.Context, t *sluice.TaskContext) (json.RawMessage, error) {
	d, err := parseSleep(t.Input)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if !sleepUntil(ctx, start.Add(d)) {
		return nil, fmt.Errorf("sleep: interrupted after %s of %s: %w", time.Since(start).Round(time.Millisecond), d, context.Cause(ctx))
	}
	return json.Marshal(struct {
		Slept  string `json:"slept"`
		TookUS int64  `json:"took_us"`
	}{d.String(), time.Since(start).Microseconds()})
}

// parseSleep decodes and checks the sleep kind's input: the handler and
// validateSleep both call it.
func parseSleep(raw json.RawMessage) (time.Duration, error) {
	var in sleepInput
	if err := decodeInput("sleep", raw, &in); err != nil {
		return 0, err
	}
	if in.Duration == nil {
		return 0, badInput("sleep", "duration", "required, e.g. \"1.5s\"")
	}
	return duration("sleep", "duration", in.Duration, 0)
}

// echoHandler returns its input as output.
func echoHandler(_ context.Context, t *sluice.TaskContext) (json.RawMessage, error) {
	if len(t.Input) == 0 {
		return nil, nil
	}
	return t.Input, nil
}
