package wiretest

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/protocol"
)

// CompleteAnswer is a complete call's answer as a busy worker gets it: n
// acks and n claimed tasks of the echo kind (the codec benchmarks' input).
func CompleteAnswer(n int) *protocol.CompleteResult {
	res := &protocol.CompleteResult{}
	now := time.Date(2026, 11, 25, 6, 0, 0, 123456000, time.UTC)
	for i := range n {
		res.Results = append(res.Results, protocol.ResultAck{TaskID: int64(i), Status: "ok"})
		res.Tasks = append(res.Tasks, protocol.ClaimedTask{ID: int64(100000 + i), Kind: "echo", Queue: "bench", Attempt: 1, MaxAttempts: 3,
			Input: json.RawMessage(fmt.Sprintf(`{"n":%d,"msg":"hello from the bench"}`, i)), Timeout: protocol.Duration(30 * time.Second),
			CreatedAt: now, StartedAt: now, LeaseExpiresAt: now.Add(30 * time.Second)})
	}
	return res
}
