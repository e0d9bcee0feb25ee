package wire

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/wire/wiretest"
	"github.com/sluice-dev/sluice/protocol"
)

// answerCases are the answers AppendAnswer writes, with values it must
// leave to encoding/json (escapes, uncompacted input, odd times).
func answerCases() []any {
	now := time.Date(2026, 11, 25, 6, 0, 0, 123456000, time.UTC)
	task := protocol.ClaimedTask{ID: 7, Kind: "echo", Queue: "q", ConcurrencyKey: "tenant-1", Attempt: 2, MaxAttempts: 3,
		Input: json.RawMessage(`{"a":"x y","b":[1,2]}`), Timeout: protocol.Duration(1500 * time.Microsecond),
		CreatedAt: now, StartedAt: now, LeaseExpiresAt: now.Add(time.Minute)}
	with := func(f func(t *protocol.ClaimedTask)) protocol.ClaimedTask { t := task; f(&t); return t }
	odd := []protocol.ClaimedTask{
		with(func(t *protocol.ClaimedTask) { t.After, t.StartedAt = 6, time.Time{} }),
		with(func(t *protocol.ClaimedTask) { t.Input = nil }),
		with(func(t *protocol.ClaimedTask) { t.Input = json.RawMessage(` { "a" : 1 } `) }),
		with(func(t *protocol.ClaimedTask) { t.Input = json.RawMessage(`"<b>&"`) }),
		with(func(t *protocol.ClaimedTask) { t.Input = json.RawMessage(`"\u2028 \" \\"`) }),
		with(func(t *protocol.ClaimedTask) { t.Input = json.RawMessage("\"\u2028\"") }),
		with(func(t *protocol.ClaimedTask) { t.Kind = "a\"b<c>\n\u00e9" }),
		with(func(t *protocol.ClaimedTask) { t.ConcurrencyKey = "\xff" }),
		with(func(t *protocol.ClaimedTask) { t.CreatedAt = now.In(time.FixedZone("x", -(5*3600 + 30*60 + 7))) }),
		with(func(t *protocol.ClaimedTask) { t.LeaseExpiresAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }),
		with(func(t *protocol.ClaimedTask) { t.CreatedAt = now.In(time.FixedZone("y", 24*3600)) }),
		with(func(t *protocol.ClaimedTask) { t.Input = json.RawMessage(`{"a":`) }),
	}
	cases := []any{
		&protocol.CompleteResult{Results: []protocol.ResultAck{}},
		&protocol.CompleteResult{},
		&protocol.CompleteResult{Results: []protocol.ResultAck{{TaskID: 1, Status: "ok"}, {TaskID: 2, Status: "stale", Next: "lost"}},
			Tasks: []protocol.ClaimedTask{task, task}},
		&protocol.ClaimResult{},
		&protocol.ClaimResult{Tasks: []protocol.ClaimedTask{}, Cancel: []int64{4, 5}},
		&protocol.ClaimResult{Tasks: []protocol.ClaimedTask{task}},
		&protocol.CompleteResult{Results: []protocol.ResultAck{{TaskID: 1, Status: "o<k"}}},
		&protocol.HeartbeatResult{},
	}
	for _, t := range odd {
		cases = append(cases, &protocol.ClaimResult{Tasks: []protocol.ClaimedTask{task, t}},
			&protocol.CompleteResult{Results: []protocol.ResultAck{}, Tasks: []protocol.ClaimedTask{t}})
	}
	return cases
}

// checkEncodes fails unless AppendAnswer writes v exactly as
// encoding/json.Encoder does, or declines. It reports whether it wrote
// it.
func checkEncodes(t *testing.T, v any) (byHand bool) {
	t.Helper()
	var want bytes.Buffer
	wantErr := json.NewEncoder(&want).Encode(v)
	out, ok := AppendAnswer(nil, v)
	if ok && wantErr != nil {
		t.Fatalf("%#v: written by hand, but encoding/json fails: %v", v, wantErr)
	}
	if ok && string(out) != want.String() {
		t.Fatalf("%#v:\nby hand:       %s\nencoding/json: %s", v, out, want.String())
	}
	return ok
}

func TestAppendAnswer(t *testing.T) {
	byHand := 0
	for _, v := range answerCases() {
		if checkEncodes(t, v) {
			byHand++
		}
	}
	// The plain answers must take the fast path, or it is dead code.
	for _, v := range []any{wiretest.CompleteAnswer(3), &protocol.ClaimResult{Tasks: wiretest.CompleteAnswer(2).Tasks, Cancel: []int64{1}}} {
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
		task := protocol.ClaimedTask{ID: id, Kind: kind, Queue: queue, ConcurrencyKey: ckey, Attempt: attempt, MaxAttempts: attempt + 1,
			Input: json.RawMessage(input), Timeout: protocol.Duration(timeout), CreatedAt: at, StartedAt: at.Add(time.Hour),
			LeaseExpiresAt: at.UTC(), After: after}
		if len(input) == 0 {
			task.Input = nil
		}
		checkEncodes(t, &protocol.CompleteResult{Results: []protocol.ResultAck{{TaskID: id, Status: status, Next: next}},
			Tasks: []protocol.ClaimedTask{task}})
		var cs []int64
		if cancel != 0 {
			cs = []int64{cancel}
		}
		checkEncodes(t, &protocol.ClaimResult{Tasks: []protocol.ClaimedTask{task, task}, Cancel: cs})
	})
}
