package engine

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
)

// enqueuer combines concurrent Enqueue calls into one store transaction
// (group commit). Every write transaction of a store is serialised (SQLite
// has one writer; PostgreSQL writers take the env row lock first), so at
// 500 triggers/s each paying its own transaction and commit, triggers
// queue behind one another. Instead, calls that arrive while a
// transaction is running wait and then go together in the next one: an
// idle server adds no delay, and a busy one pays one commit per group
// instead of one per trigger.
//
// A group is all or nothing in the store; so that one call's rejection
// (an admission ceiling) or failure never becomes another's, a group that
// fails is run again call by call and each gets its own answer.
type enqueuer struct {
	st       store.Store
	maxTasks int // most tasks in one combined transaction

	mu      sync.Mutex
	pending []*enqueueCall
	running bool // a goroutine is draining pending

	// onGroup observes the calls of each transaction that ran (metrics,
	// tests).
	onGroup func(calls int)
}

type enqueueCall struct {
	ctx   context.Context
	lim   store.Limits
	tasks []store.NewTask

	res  []store.EnqueueResult
	o    store.Outcome
	err  error
	done chan struct{}
}

// groupMaxTasks is the most tasks combined into one transaction (a
// single larger call still goes alone).
const groupMaxTasks = 1000

// groupTimeout bounds a combined transaction: it runs on behalf of several
// callers, so none of their contexts may cancel it.
const groupTimeout = 30 * time.Second

func newEnqueuer(st store.Store, maxTasks int) *enqueuer {
	return &enqueuer{st: st, maxTasks: maxTasks}
}

// enqueue runs st.Enqueue for tasks, possibly in one transaction with
// other concurrent calls. If ctx ends before the call joined a
// transaction, nothing is inserted and ctx's error returned; once it has
// joined, the call completes (as an answer lost on the way would).
func (q *enqueuer) enqueue(ctx context.Context, lim store.Limits, tasks []store.NewTask) ([]store.EnqueueResult, store.Outcome, error) {
	c := &enqueueCall{ctx: ctx, lim: lim, tasks: tasks, done: make(chan struct{})}
	q.mu.Lock()
	q.pending = append(q.pending, c)
	if !q.running {
		q.running = true
		go q.drain()
	}
	q.mu.Unlock()
	select {
	case <-c.done:
		return c.res, c.o, c.err
	case <-ctx.Done():
	}
	q.mu.Lock()
	for i, p := range q.pending {
		if p == c {
			q.pending = append(q.pending[:i], q.pending[i+1:]...)
			q.mu.Unlock()
			return nil, store.Outcome{}, ctx.Err()
		}
	}
	q.mu.Unlock()
	<-c.done // taken into a transaction: its answer comes
	return c.res, c.o, c.err
}

// drain runs groups until nothing is pending.
func (q *enqueuer) drain() {
	for {
		q.mu.Lock()
		n, tasks := 0, 0
		for n < len(q.pending) && (n == 0 || tasks+len(q.pending[n].tasks) <= q.maxTasks) && q.pending[n].lim == q.pending[0].lim {
			tasks += len(q.pending[n].tasks)
			n++
		}
		if n == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		group := make([]*enqueueCall, n)
		copy(group, q.pending[:n])
		q.pending = append(q.pending[:0], q.pending[n:]...)
		q.mu.Unlock()
		q.run(group)
	}
}

// run runs one group and answers its calls.
func (q *enqueuer) run(group []*enqueueCall) {
	defer func() {
		for _, c := range group {
			close(c.done)
		}
	}()
	if len(group) == 1 {
		c := group[0]
		c.res, c.o, c.err = q.st.Enqueue(context.WithoutCancel(c.ctx), c.lim, c.tasks)
		q.observe(1)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(group[0].ctx), groupTimeout)
	defer cancel()
	var all []store.NewTask
	for _, c := range group {
		all = append(all, c.tasks...)
	}
	res, o, err := q.st.Enqueue(ctx, group[0].lim, all)
	if err != nil {
		// One call's rejection must not be another's: each on its own.
		for _, c := range group {
			c.res, c.o, c.err = q.st.Enqueue(context.WithoutCancel(c.ctx), c.lim, c.tasks)
			q.observe(1)
		}
		return
	}
	q.observe(len(group))
	// The group's outcome (tasks made ready) goes to its first call: the
	// engine wakes workers once per outcome.
	group[0].o = o
	for _, c := range group {
		c.res, res = res[:len(c.tasks):len(c.tasks)], res[len(c.tasks):]
	}
}

func (q *enqueuer) observe(calls int) {
	if q.onGroup != nil {
		q.onGroup(calls)
	}
}
