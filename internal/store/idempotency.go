package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice"
)

// Idempotency keys name one request: a trigger or run start sent again
// with the same key gets the task or run the key first created. Sent
// again with a different task or run, the key is a mistake (a key
// reused for another order, a client bug), and answering with the old
// task would hide it: the store answers 409 conflict instead, as Stripe
// does. What must match:
//
//   - a task: its kind, its queue (after the default, the kind) and its
//     input;
//   - a run: its workflow and its input (not its version: a start that
//     asked for the latest version, sent again after a new version was
//     applied, is the same start).
//
// Inputs match when they are the same JSON value (JSONEqual): key order,
// white space and the spelling of numbers (1.0, 1e0, 1) do not count, so
// a client that re-encodes the same value is not refused. Everything
// else (priority, attempts, timeouts, run_at) may differ: the first
// request's values stay.

// TaskReplay checks that nt, whose idempotency key names existing, asks
// for the same task; else it returns a conflict that says what differs.
func TaskReplay(nt *NewTask, existing *sluice.Task) error {
	var what string
	switch {
	case nt.Kind != existing.Kind:
		what = fmt.Sprintf("kind %q, not %q", nt.Kind, existing.Kind)
	case nt.Queue != existing.Queue:
		what = fmt.Sprintf("queue %q, not %q", nt.Queue, existing.Queue)
	case !JSONEqual(nt.Input, existing.Input):
		what = "a different input"
	default:
		return nil
	}
	return sluice.Conflict("idempotency key %q was used for a different task (task %d): this one has %s; use a new key for a new task",
		nt.IdempotencyKey, existing.ID, what)
}

// batchReplay checks that two tasks of one Enqueue batch with the same
// idempotency key ask for the same task.
func batchReplay(nt, first *NewTask) error {
	if nt.Kind == first.Kind && nt.Queue == first.Queue && JSONEqual(nt.Input, first.Input) {
		return nil
	}
	return sluice.Conflict("idempotency key %q is given to two different tasks of the batch: use a key per task", nt.IdempotencyKey)
}

// RunReplay checks that r, whose idempotency key names run id of
// workflow with input, asks for the same run; else it returns a
// conflict that says what differs.
func RunReplay(r *NewRun, id int64, workflow string, input []byte) error {
	var what string
	switch {
	case r.Workflow != workflow:
		what = fmt.Sprintf("workflow %q, not %q", r.Workflow, workflow)
	case !JSONEqual(r.Input, input):
		what = "a different input"
	default:
		return nil
	}
	return sluice.Conflict("idempotency key %q was used for a different run (run %d): this one has %s; use a new key for a new run",
		r.IdempotencyKey, id, what)
}

// JSONEqual reports whether a and b are the same JSON value: objects
// with the same members in any order, arrays with the same elements in
// order, numbers of the same value however written. Empty is null. Text
// that is not JSON equals only the same bytes.
func JSONEqual(a, b []byte) bool {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if len(a) == 0 {
		a = []byte("null")
	}
	if len(b) == 0 {
		b = []byte("null")
	}
	if bytes.Equal(a, b) {
		return true
	}
	va, errA := decodeJSON(a)
	vb, errB := decodeJSON(b)
	if errA != nil || errB != nil {
		return false
	}
	return jsonValueEqual(va, vb)
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func jsonValueEqual(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok || !jsonValueEqual(va, vb) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !jsonValueEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		return a == b || numberEqual(string(a), string(b))
	default: // string, bool, nil
		return a == b
	}
}

// maxExponent bounds the exponents numberEqual computes with: 1e999999999
// is short to send but long to expand. Numbers beyond it compare as
// written.
const maxExponent = 400

// numberEqual reports whether two JSON numbers have the same value,
// exactly (no float64 rounding: 2^53+1 is not 2^53).
func numberEqual(a, b string) bool {
	if !smallExponent(a) || !smallExponent(b) {
		return false
	}
	ra, okA := new(big.Rat).SetString(a)
	rb, okB := new(big.Rat).SetString(b)
	return okA && okB && ra.Cmp(rb) == 0
}

func smallExponent(n string) bool {
	i := strings.IndexAny(n, "eE")
	if i < 0 {
		return true
	}
	e, err := strconv.Atoi(strings.TrimPrefix(n[i+1:], "+"))
	return err == nil && e >= -maxExponent && e <= maxExponent
}
