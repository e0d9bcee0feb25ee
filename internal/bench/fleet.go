package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// fleet is the servers of one throughput run. Either one env whose n
// replicas share a schema (Config.Replicas), or, with Config.Separate, n
// envs of one server each: n deployments side by side on the one
// PostgreSQL, each on a schema of its own (so with an env row, and its
// lock, of its own), with its own connection pool, worker, standby worker
// and, under Config.DBLatency, its own proxy. Queue q is served by server
// q.replica of either: replica q.replica, or the server of deployment
// q.replica.
type fleet struct {
	envs     []*env
	separate bool
}

// newFleet starts the servers of a run of shape over queues on n servers,
// as replicas of one schema or, separate, as n deployments.
func newFleet(ctx context.Context, cfg *Config, shape Shape, n int, separate bool, queues []benchQueue) (_ *fleet, err error) {
	f := &fleet{separate: separate}
	if !separate {
		e, err := newEnv(ctx, cfg, string(shape), envOptions{replicas: n, kinds: queueKinds(queues)})
		if err != nil {
			return nil, err
		}
		f.envs = []*env{e}
		return f, nil
	}
	defer func() {
		if err != nil {
			_ = f.close()
		}
	}()
	for i := range n {
		var own []benchQueue
		for _, q := range queues {
			if q.replica == i {
				own = append(own, q)
			}
		}
		e, err := newEnv(ctx, cfg, string(shape)+"_d"+strconv.Itoa(i+1), envOptions{kinds: queueKinds(own)})
		if err != nil {
			return nil, fmt.Errorf("deployment %d: %w", i+1, err)
		}
		f.envs = append(f.envs, e)
	}
	return f, nil
}

// queueKinds are the kinds of queues other than the built-in echo: those
// the standby worker must also serve.
func queueKinds(queues []benchQueue) []string {
	var kinds []string
	for _, q := range queues {
		if q.kind != "echo" {
			kinds = append(kinds, q.kind)
		}
	}
	return kinds
}

// servers are the run's servers, server i serving the queues whose
// replica is i.
func (f *fleet) servers() []*replica {
	if !f.separate {
		return f.envs[0].replicas
	}
	out := make([]*replica, len(f.envs))
	for i, e := range f.envs {
		out[i] = e.replicas[0]
	}
	return out
}

// envOf is the env that holds q's rows.
func (f *fleet) envOf(q benchQueue) *env {
	if f.separate {
		return f.envs[q.replica]
	}
	return f.envs[0]
}

// byEnv groups queues' names by the env that holds them, in env order.
func (f *fleet) byEnv(queues []benchQueue) []envQueues {
	out := make([]envQueues, len(f.envs))
	for i, e := range f.envs {
		out[i].e = e
	}
	for _, q := range queues {
		i := 0
		if f.separate {
			i = q.replica
		}
		out[i].queues = append(out[i].queues, q.name)
	}
	return out
}

// envQueues are queues of one env.
type envQueues struct {
	e      *env
	queues []string
}

// checkpoint settles every env's database after the setup (env.checkpoint).
func (f *fleet) checkpoint(ctx context.Context) error {
	for _, e := range f.envs {
		if err := e.checkpoint(ctx); err != nil {
			return err
		}
	}
	return nil
}

// waitDrained waits until every one of queues has no unfinished task, as
// env.waitAllDrained does.
func (f *fleet) waitDrained(ctx context.Context, cfg *Config, queues []benchQueue, total int64, deadline time.Time) (time.Time, error) {
	groups := f.byEnv(queues)
	names := make([]string, len(queues))
	for i, q := range queues {
		names[i] = q.name
	}
	return waitUntilDrained(ctx, cfg, names, total, deadline, func(ctx context.Context) (int64, error) {
		var n int64
		for _, g := range groups {
			if len(g.queues) == 0 {
				continue
			}
			m, err := g.e.activeIn(ctx, g.queues)
			if err != nil {
				return 0, err
			}
			n += m
		}
		return n, nil
	})
}

// close stops every env's servers and drops its schema.
func (f *fleet) close() error {
	var errs []error
	for _, e := range f.envs {
		errs = append(errs, e.close())
	}
	return errors.Join(errs...)
}
