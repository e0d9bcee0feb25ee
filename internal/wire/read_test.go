package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/wire/wiretest"
	"github.com/sluice-dev/sluice/protocol"
)

// marshal is encoding/json's bytes of v, as the server sends them.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// claimAnswer is the answer to a long-poll claim of n tasks.
func claimAnswer(n int) []byte {
	return marshal(protocol.ClaimResult{Tasks: wiretest.CompleteAnswer(n).Tasks, Cancel: []int64{7, 8}})
}

// The server's answers (encoding/json's layout, which AppendAnswer
// keeps) are read by hand, not left to a general decoder.
func TestReadAnswerServerLayout(t *testing.T) {
	for _, raw := range [][]byte{marshal(wiretest.CompleteAnswer(3)), claimAnswer(2), marshal(wiretest.CompleteAnswer(0)), []byte(`{"tasks":null}` + "\n"),
		[]byte(`{"results":[{"task_id":1,"status":"stale","next":"lost"}],"tasks":[{"id":1,"kind":"k","queue":"q","concurrency_key":"é",` +
			`"attempt":1,"max_attempts":1,"input":null,"timeout":"1.5µs","created_at":"2026-11-25T06:00:00+05:30",` +
			`"started_at":"0001-01-01T00:00:00Z","lease_expires_at":"2026-11-25T06:00:00.1Z","after":9}]}`)} {
		for _, mk := range []func() any{func() any { return &protocol.CompleteResult{} }, func() any { return &protocol.ClaimResult{} }} {
			want, got := mk(), mk()
			if json.Unmarshal(raw, want) != nil {
				t.Fatalf("%s: not an answer", raw)
			}
			isClaim := bytes.HasPrefix(raw, []byte(`{"tasks"`))
			if _, claim := got.(*protocol.ClaimResult); claim != isClaim {
				if ReadAnswer(raw, got) {
					t.Fatalf("%T read by hand from %s", got, raw)
				}
				continue
			}
			if !ReadAnswer(raw, got) {
				t.Fatalf("%T from %s: not read by hand", got, raw)
			}
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("%T from %s: encoding/json gives %+v, ReadAnswer %+v", got, raw, want, got)
			}
		}
	}
}

// FuzzReadAnswer: an answer in the server's layout with any values is
// read by hand to what encoding/json reads, or declined.
func FuzzReadAnswer(f *testing.F) {
	f.Add(int64(1), "echo", "", 1, []byte(`{"n":1}`), int64(time.Second), int64(1795600000123456789), 0, int64(0), "ok", "", int64(0))
	f.Add(int64(-5), "a<b", "\xff", -1, []byte(`[1,"<"]`), int64(-1), int64(-62135596800000000), 3600+7, int64(9), "st\"ale", "lost", int64(3))
	f.Add(int64(0), "\u2028", "k", 0, []byte(`null`), int64(0), int64(0), -86399, int64(-1), "", "started", int64(-2))
	f.Fuzz(func(t *testing.T, id int64, kind, ckey string, attempt int, input []byte, timeout, unixNano int64, offset int,
		after int64, status, next string, cancel int64) {
		at := time.Unix(0, unixNano).In(time.FixedZone("", offset))
		task := protocol.ClaimedTask{ID: id, Kind: kind, Queue: "q", ConcurrencyKey: ckey, Attempt: attempt, MaxAttempts: attempt + 1,
			Input: json.RawMessage(input), Timeout: protocol.Duration(timeout), CreatedAt: at, StartedAt: at.Add(time.Hour),
			LeaseExpiresAt: at.UTC(), After: after}
		var cs []int64
		if cancel != 0 {
			cs = []int64{cancel}
		}
		for _, v := range []any{&protocol.CompleteResult{Results: []protocol.ResultAck{{TaskID: id, Status: status, Next: next}}, Tasks: []protocol.ClaimedTask{task}},
			&protocol.ClaimResult{Tasks: []protocol.ClaimedTask{task, task}, Cancel: cs}} {
			raw, err := json.Marshal(v)
			if err != nil {
				continue // not an answer the server could send
			}
			want := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			got := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			if json.Unmarshal(raw, want) != nil {
				continue
			}
			if ReadAnswer(raw, got) && !reflect.DeepEqual(want, got) {
				t.Fatalf("%T from %s: encoding/json gives %+v, ReadAnswer %+v", got, raw, want, got)
			}
		}
	})
}
