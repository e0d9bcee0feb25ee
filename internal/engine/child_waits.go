package engine

import (
	"sync"
	"sync/atomic"
)

// childWaits wakes the waits of parents for their children (WaitChild)
// on this server: a wait watches its child's key, closed when the engine
// sees the child end (a result, a cancel, a run's end), and two
// broadcasts: anyEnd, when tasks may have ended whose ids the engine does
// not know (a sweep of expired leases or deadlines, a worker
// deregistered), and readied, when tasks became ready (a parent whose
// child ended may have its slots back). A wake-up only makes the wait
// take another step (one store transaction): a spurious one costs that.
type childWaits struct {
	// watching counts the waits under way: without any, a wake-up costs
	// one atomic load.
	watching atomic.Int64

	mu      sync.Mutex
	keys    map[waitKey]*keyWatch
	anyEnd  chan struct{}
	readied chan struct{}
}

// waitKey is a child: a task or a run.
type waitKey struct{ task, run int64 }

type keyWatch struct {
	ch chan struct{}
	n  int // waits watching
}

// watch starts watching k's end; unwatch stops it.
func (c *childWaits) watch(k waitKey) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[waitKey]*keyWatch{}
	}
	w := c.keys[k]
	if w == nil {
		w = &keyWatch{ch: make(chan struct{})}
		c.keys[k] = w
	}
	w.n++
	c.watching.Add(1)
	return w.ch
}

// rewatch returns k's channel after the one watch returned was closed.
func (c *childWaits) rewatch(k waitKey) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.keys[k]; w != nil {
		return w.ch
	}
	return nil // not watched: never closes
}

func (c *childWaits) unwatch(k waitKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watching.Add(-1)
	if w := c.keys[k]; w != nil {
		if w.n--; w.n <= 0 {
			delete(c.keys, k)
		}
	}
}

// ended wakes the waits for the children ks.
func (c *childWaits) ended(ks ...waitKey) {
	if c.watching.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range ks {
		if w := c.keys[k]; w != nil {
			close(w.ch)
			w.ch = make(chan struct{})
		}
	}
}

// endedTasks wakes the waits for the child tasks ids.
func (c *childWaits) endedTasks(ids []int64) {
	if c.watching.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if w := c.keys[waitKey{task: id}]; w != nil {
			close(w.ch)
			w.ch = make(chan struct{})
		}
	}
}

// broadcasts returns the channels the next broadcasts close.
func (c *childWaits) broadcasts() (anyEnd, readied <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.anyEnd == nil {
		c.anyEnd = make(chan struct{})
	}
	if c.readied == nil {
		c.readied = make(chan struct{})
	}
	return c.anyEnd, c.readied
}

// someEnded wakes every wait for a child: tasks ended that the caller
// cannot name.
func (c *childWaits) someEnded() {
	if c.watching.Load() == 0 {
		return
	}
	c.mu.Lock()
	if c.anyEnd != nil {
		close(c.anyEnd)
		c.anyEnd = nil
	}
	c.mu.Unlock()
}

// wasReadied wakes the waits for slots back: tasks became ready.
func (c *childWaits) wasReadied() {
	if c.watching.Load() == 0 {
		return
	}
	c.mu.Lock()
	if c.readied != nil {
		close(c.readied)
		c.readied = nil
	}
	c.mu.Unlock()
}
