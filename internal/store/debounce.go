package store

import (
	"encoding/json"
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store/flow"
)

// Debounce (S-FC10) at a trigger, shared by both stores: which triggers
// merge into which pending task is decided here and in
// flow/debounce.go; each store supplies its I/O (DebounceIO) and writes
// what the pass leaves (DebouncedTask, DebounceKey).
//
// The order at a trigger: an idempotency key is looked at first (a
// repeat gets its first answer, Replays); then debounce, whose merges
// create nothing and so pass no admission ceiling; then admission for
// the tasks still to create; a queue's strategy acts when a debounced
// task becomes due (PromoteDue), not at its triggers.

// DebouncedTask is what a task that opens a debounce group is written
// with: its group, the latest start its max_wait allows (0: no cap) and
// the count of the triggers it stands for.
type DebouncedTask struct {
	Group    string
	Until    int64
	Triggers int
}

// Columns are the debounce columns of a task (debounce_group,
// debounce_until, debounce_triggers): NULL for d nil, a task that is not
// debounced.
func (d *DebouncedTask) Columns() (group *string, until *int64, triggers *int64) {
	if d == nil {
		return nil, nil, nil
	}
	n := int64(d.Triggers)
	if d.Until > 0 {
		until = &d.Until
	}
	return &d.Group, until, &n
}

// DebounceKey is the idempotency key of a debounced trigger with the
// input it sent, recorded apart from the task (debounce_keys): a later
// trigger may replace the task's input, and a repeat must still be
// recognised as the same request.
type DebounceKey struct {
	Key    string
	TaskID int64
	Input  json.RawMessage
}

// DebounceIO is a store's I/O for Debounces, in its write transaction.
type DebounceIO struct {
	// Queue reads (creating it) a trigger's queue.
	Queue func(name string) (*flow.Queue, error)
	// Find reads, and locks against a concurrent claim, the newest task
	// of a debounce group of a queue (found false: the group has none).
	Find func(queue, group string) (p flow.Pending, found bool, err error)
	// Merge writes a trigger merged into pending task p: its input, its
	// move to state to at runAt (flow's transition table), and its count
	// of triggers; and returns the task as the answer shows it.
	Merge func(nt *NewTask, p *flow.Pending, to sluice.TaskState, runAt int64) (*sluice.Task, error)
}

// Debounces runs the debounce of a trigger batch's fresh tasks (after
// Replays, before admission). It merges each trigger that finds its
// group's pending task, in the database or opened by an earlier task of
// the batch, and marks each task that opens a group (NewTask.Debounced,
// its start Period ahead). It returns the fresh tasks still to insert
// and finish, to call once they are: it fills in the answers of the
// triggers merged into a task of the batch and returns the idempotency
// keys to record.
func Debounces(tasks []NewTask, fresh []int, results []EnqueueResult, nowUS int64, io DebounceIO) (
	insert []int, finish func() []DebounceKey, err error) {
	// own is the key of a trigger answered from a task of the batch,
	// with the input it sent: a debounced task's own key is recorded
	// there too, not on the task, whose input a later trigger replaces.
	type ownKey struct {
		key    string
		input  json.RawMessage
		task   int
		opener bool
	}
	var (
		keys   []DebounceKey
		own    []ownKey
		opened map[string]int // queue and group → the batch's task that opened it
		into   map[int]int    // a trigger merged into a task of the batch → that task
	)
	for _, i := range fresh {
		nt := &tasks[i]
		d, err := debounceOf(nt, io)
		if err != nil {
			return nil, nil, err
		}
		if d == nil {
			insert = append(insert, i)
			continue
		}
		group := d.Group(nt.Kind, nt.ConcurrencyKey)
		qg := nt.Queue + " " + group
		if j, ok := opened[qg]; ok {
			// The last trigger wins; the start is the same (one now).
			tasks[j].Input = nt.Input
			tasks[j].Debounced.Triggers++
			into[i] = j
			if nt.IdempotencyKey != "" {
				own = append(own, ownKey{nt.IdempotencyKey, nt.Input, j, false})
			}
			continue
		}
		p, found, err := io.Find(nt.Queue, group)
		if err != nil {
			return nil, nil, err
		}
		if found && p.Mergeable() {
			to, runAt := d.Merge(&p, nowUS)
			task, err := io.Merge(nt, &p, to, runAt)
			if err != nil {
				return nil, nil, err
			}
			task.Debounced = true
			results[i] = EnqueueResult{Task: task}
			if nt.IdempotencyKey != "" {
				task.IdempotencyKey = nt.IdempotencyKey
				keys = append(keys, DebounceKey{Key: nt.IdempotencyKey, TaskID: task.ID, Input: nt.Input})
			}
			continue
		}
		runAt, until := d.First(nowUS)
		nt.RunAt = FromUS(runAt)
		nt.Debounced = &DebouncedTask{Group: group, Until: until, Triggers: 1}
		if nt.IdempotencyKey != "" {
			own = append(own, ownKey{nt.IdempotencyKey, nt.Input, i, true})
			nt.IdempotencyKey = ""
		}
		if opened == nil {
			opened, into = map[string]int{}, map[int]int{}
		}
		opened[qg] = i
		insert = append(insert, i)
	}
	return insert, func() []DebounceKey {
		for _, o := range own {
			r := results[o.task].Task
			if r == nil {
				continue
			}
			if o.opener {
				r.IdempotencyKey = o.key // taken off its row
			}
			keys = append(keys, DebounceKey{Key: o.key, TaskID: r.ID, Input: o.input})
		}
		for i, j := range into {
			if r := results[j].Task; r != nil {
				task := *r
				task.Debounced, task.Attempts, task.IdempotencyKey = true, nil, tasks[i].IdempotencyKey
				results[i] = EnqueueResult{Task: &task}
			}
		}
		return keys
	}, nil
}

// debounceOf is the debounce a fresh task is triggered under: its own,
// else its queue's unless it was given a time (run_at); nil for a task
// of a workflow run and for a child (keyed ChildKeyPrefix), which are
// never debounced: a parent waits for its own child.
func debounceOf(nt *NewTask, io DebounceIO) (*flow.Debounce, error) {
	if nt.Run != nil || strings.HasPrefix(nt.IdempotencyKey, ChildKeyPrefix) {
		return nil, nil
	}
	if nt.Debounce != nil {
		return flow.DebounceOf(nt.Debounce), nil
	}
	if !nt.RunAt.IsZero() {
		return nil, nil
	}
	q, err := io.Queue(nt.Queue)
	if err != nil {
		return nil, err
	}
	return q.Debounce(), nil
}

// DebounceRejected is the error of a debounced task that its queue's
// strategy cancel_newest cancelled when it came due: its sub-queue was
// full.
func DebounceRejected(sq *flow.Subqueue) string {
	return "cancelled by cancel_newest when its debounce period ended: " + subqueueFull(sq)
}

// DebounceReplay is the answer to a repeat of a debounced trigger whose
// key debounce_keys records with the input it sent: the task, showing
// that input (the first answer's), so that Replays compares the repeat
// with what was sent under the key.
func DebounceReplay(task *sluice.Task, key string, input json.RawMessage) *sluice.Task {
	task.Input = JSONOrNull(input)
	task.IdempotencyKey = key
	task.Debounced = true
	return task
}
