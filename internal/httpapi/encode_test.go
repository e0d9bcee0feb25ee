package httpapi

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dev/sluice"
)

// answerCases are the answers appendAnswer writes, with values it must
// leave to encoding/json (escapes, uncompacted input, odd times).
func answerCases() []any {
	now := time.Date(2026, 11, 25, 6, 0, 0, 123456000, time.UTC)
	task := sluice.ClaimedTask{ID: 7, Kind: "echo", Queue: "q", ConcurrencyKey: "tenant-1", Attempt: 2, MaxAttempts: 3,
		Input: json.RawMessage(`{"a":"x y","b":[1,2]}`), Timeout: sluice.Duration(1500 * time.Microsecond),
		CreatedAt: now, StartedAt: now, LeaseExpiresAt: now.Add(time.Minute)}
	with := func(f func(t *sluice.ClaimedTask)) sluice.ClaimedTask { t := task; f(&t); return t }
	odd := []sluice.ClaimedTask{
		with(func(t *sluice.ClaimedTask) { t.After, t.StartedAt = 6, time.Time{} }),
		with(func(t *sluice.ClaimedTask) { t.Input = nil }),
		with(func(t *sluice.ClaimedTask) { t.Input = json.RawMessage(` { "a" : 1 } `) }),
		with(func(t *sluice.ClaimedTask) { t.Input = json.RawMessage(`"<b>&"`) }),
		with(func(t *sluice.ClaimedTask) { t.Input = json.RawMessage(`"\u2028 \" \\"`) }),
		with(func(t *sluice.ClaimedTask) { t.Input = json.RawMessage("\"\u2028\"") }),
		with(func(t *sluice.ClaimedTask) { t.Kind = "a\"b<c>\n\u00e9" }),
		with(func(t *sluice.ClaimedTask) { t.ConcurrencyKey = "\xff" }),
		with(func(t *sluice.ClaimedTask) { t.CreatedAt = now.In(time.FixedZone("x", -(5*3600 + 30*60 + 7))) }),
		with(func(t *sluice.ClaimedTask) { t.LeaseExpiresAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }),
		with(func(t *sluice.ClaimedTask) { t.CreatedAt = now.In(time.FixedZone("y", 24*3600)) }),
		with(func(t *sluice.ClaimedTask) { t.Input = json.RawMessage(`{"a":`) }),
	}
	cases := []any{
		&sluice.CompleteResult{Results: []sluice.ResultAck{}},
		&sluice.CompleteResult{},
		&sluice.CompleteResult{Results: []sluice.ResultAck{{TaskID: 1, Status: "ok"}, {TaskID: 2, Status: "stale", Next: "lost"}},
			Tasks: []sluice.ClaimedTask{task, task}},
		&sluice.ClaimResult{},
		&sluice.ClaimResult{Tasks: []sluice.ClaimedTask{}, Cancel: []int64{4, 5}},
		&sluice.ClaimResult{Tasks: []sluice.ClaimedTask{task}},
		&sluice.CompleteResult{Results: []sluice.ResultAck{{TaskID: 1, Status: "o<k"}}},
		&sluice.HeartbeatResult{},
	}
	for _, t := range odd {
		cases = append(cases, &sluice.ClaimResult{Tasks: []sluice.ClaimedTask{task, t}},
			&sluice.CompleteResult{Results: []sluice.ResultAck{}, Tasks: []sluice.ClaimedTask{t}})
	}
	return cases
}

// checkEncodes fails unless encodeAnswer writes v exactly as
// encoding/json.Encoder does, or fails where it fails. It reports
// whether the hand-written path wrote it.
func checkEncodes(t *testing.T, v any) (byHand bool) {
	t.Helper()
	var want bytes.Buffer
	wantErr := json.NewEncoder(&want).Encode(v)
	out, ok := appendAnswer(nil, v)
	if ok && wantErr != nil {
		t.Fatalf("%#v: written by hand, but encoding/json fails: %v", v, wantErr)
	}
	if ok && string(out) != want.String() {
		t.Fatalf("%#v:\nby hand:       %s\nencoding/json: %s", v, out, want.String())
	}
	var got bytes.Buffer
	err := encodeAnswer(&got, v)
	if (err != nil) != (wantErr != nil) || got.String() != want.String() {
		t.Fatalf("%#v: encodeAnswer = %q, %v; encoding/json %q, %v", v, got.String(), err, want.String(), wantErr)
	}
	return ok
}

func TestEncodeAnswer(t *testing.T) {
	byHand := 0
	for _, v := range answerCases() {
		if checkEncodes(t, v) {
			byHand++
		}
	}
	// The plain answers must take the fast path, or it is dead code.
	for _, v := range []any{completeAnswer(3), &sluice.ClaimResult{Tasks: completeAnswer(2).Tasks, Cancel: []int64{1}}} {
		if !checkEncodes(t, v) {
			t.Fatalf("%#v: not written by hand", v)
		}
	}
	if byHand < 8 {
		t.Fatalf("only %d of the cases written by hand", byHand)
	}
}

// FuzzEncodeAnswer: whatever the values, the answer's bytes are
// encoding/json's.
func FuzzEncodeAnswer(f *testing.F) {
	f.Add(int64(1), "echo", "q", "", 1, []byte(`{"n":1}`), int64(time.Second), int64(1795600000123456789), 0, int64(0), "ok", "", int64(0))
	f.Add(int64(-5), "a<b", "\xff", "k\n", -1, []byte(" [1, \"<\"] "), int64(-1), int64(-62135596800000000), 3600+7, int64(9), "stale", "lost", int64(3))
	f.Add(int64(0), "", "", "\u2028", 0, []byte("\"\\u2028\""), int64(0), int64(0), -86399, int64(-1), "", "started", int64(-2))
	f.Fuzz(func(t *testing.T, id int64, kind, queue, ckey string, attempt int, input []byte, timeout, unixNano int64, offset int,
		after int64, status, next string, cancel int64) {
		at := time.Unix(0, unixNano).In(time.FixedZone("z", offset))
		task := sluice.ClaimedTask{ID: id, Kind: kind, Queue: queue, ConcurrencyKey: ckey, Attempt: attempt, MaxAttempts: attempt + 1,
			Input: json.RawMessage(input), Timeout: sluice.Duration(timeout), CreatedAt: at, StartedAt: at.Add(time.Hour),
			LeaseExpiresAt: at.UTC(), After: after}
		if len(input) == 0 {
			task.Input = nil
		}
		checkEncodes(t, &sluice.CompleteResult{Results: []sluice.ResultAck{{TaskID: id, Status: status, Next: next}},
			Tasks: []sluice.ClaimedTask{task}})
		var cs []int64
		if cancel != 0 {
			cs = []int64{cancel}
		}
		checkEncodes(t, &sluice.ClaimResult{Tasks: []sluice.ClaimedTask{task, task}, Cancel: cs})
	})
}
