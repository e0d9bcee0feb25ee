package sluice

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ApplyWorkflow uploads a workflow definition (POST /v1/workflows), YAML
// or JSON as contentType says.
func (c *Client) ApplyWorkflow(ctx context.Context, definition []byte, contentType string) (*ApplyResult, error) {
	var r ApplyResult
	if _, err := c.do(ctx, http.MethodPost, "/v1/workflows", nil, rawBody{definition, contentType}, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// GetWorkflow returns a workflow version with its definition (GET
// /v1/workflows/{name}); version 0 is the latest.
func (c *Client) GetWorkflow(ctx context.Context, name string, version int) (*WorkflowInfo, error) {
	var q url.Values
	if version > 0 {
		q = url.Values{"version": {strconv.Itoa(version)}}
	}
	var w WorkflowInfo
	if _, err := c.do(ctx, http.MethodGet, "/v1/workflows/"+url.PathEscape(name), q, nil, &w, 0); err != nil {
		return nil, err
	}
	return &w, nil
}

// ListWorkflows returns the latest version of every workflow (GET
// /v1/workflows).
func (c *Client) ListWorkflows(ctx context.Context) ([]WorkflowInfo, error) {
	var out struct {
		Workflows []WorkflowInfo `json:"workflows"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/v1/workflows", nil, nil, &out, 0); err != nil {
		return nil, err
	}
	return out.Workflows, nil
}

// StartRun starts a run (POST /v1/runs). created is false when the
// idempotency key matched an existing run.
func (c *Client) StartRun(ctx context.Context, p StartRunParams) (*Run, bool, error) {
	var r Run
	status, err := c.do(ctx, http.MethodPost, "/v1/runs", nil, p, &r, 0)
	if err != nil {
		return nil, false, err
	}
	return &r, status == http.StatusCreated, nil
}

// GetRun returns a run with its steps (GET /v1/runs/{id}).
func (c *Client) GetRun(ctx context.Context, id int64) (*Run, error) {
	var r Run
	if _, err := c.do(ctx, http.MethodGet, "/v1/runs/"+strconv.FormatInt(id, 10), nil, nil, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// ListRuns returns one page of runs, newest first (GET /v1/runs).
func (c *Client) ListRuns(ctx context.Context, f RunFilter) (*RunPage, error) {
	q := url.Values{}
	if f.Workflow != "" {
		q.Set("workflow", f.Workflow)
	}
	if f.State != "" {
		q.Set("state", string(f.State))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.After != "" {
		q.Set("after", f.After)
	}
	var page RunPage
	if _, err := c.do(ctx, http.MethodGet, "/v1/runs", q, nil, &page, 0); err != nil {
		return nil, err
	}
	return &page, nil
}

// CancelRun cancels a run (POST /v1/runs/{id}/cancel).
func (c *Client) CancelRun(ctx context.Context, id int64) (*Run, error) {
	var r Run
	if _, err := c.do(ctx, http.MethodPost, "/v1/runs/"+strconv.FormatInt(id, 10)+"/cancel", nil, nil, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// WaitRun polls the run until it ends. See the package function WaitRun.
func (c *Client) WaitRun(ctx context.Context, id int64) (*Run, error) {
	return WaitRun(ctx, c, id, nil)
}

// WaitRun polls b until run id has ended (succeeded, failed or cancelled)
// and returns it; progress, if not nil, is called with each reading.
// Polls start 10ms apart and back off to 500ms; errors that retrying
// cannot fix return at once, others are retried until ctx is done.
func WaitRun(ctx context.Context, b Backend, id int64, progress func(*Run)) (*Run, error) {
	return poll(ctx, fmt.Sprintf("run %d", id), func() (*Run, bool, error) {
		r, err := b.GetRun(ctx, id)
		if err != nil {
			return nil, false, err
		}
		if progress != nil {
			progress(r)
		}
		return r, r.State.Terminal(), nil
	}, nil)
}

// poll calls get until it reports done, backing off from 10ms to 500ms,
// returning at once on an error retrying cannot fix. retrying, if not
// nil, is told each error that poll retries.
func poll[T any](ctx context.Context, what string, get func() (T, bool, error), retrying func(error)) (T, error) {
	const (
		first = 10 * time.Millisecond
		most  = 500 * time.Millisecond
	)
	var zero T
	delay := first
	var timer *time.Timer
	var lastErr error
	for {
		v, done, err := get()
		switch {
		case err == nil:
			if done {
				return v, nil
			}
			lastErr = nil
		case ctx.Err() != nil:
		case permanent(err):
			return zero, fmt.Errorf("waiting for %s: %w", what, err)
		default:
			lastErr = err
			if retrying != nil {
				retrying(err)
			}
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return zero, fmt.Errorf("waiting for %s: %w (last error: %v)", what, context.Cause(ctx), lastErr)
			}
			return zero, fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case <-timer.C:
		}
		delay = min(delay*2, most)
	}
}

// ListSchedules returns every workflow's cron schedules (GET
// /v1/schedules).
func (c *Client) ListSchedules(ctx context.Context) ([]Schedule, error) {
	var out struct {
		Schedules []Schedule `json:"schedules"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/v1/schedules", nil, nil, &out, 0); err != nil {
		return nil, err
	}
	return out.Schedules, nil
}

// PauseSchedule pauses a schedule (POST /v1/schedules/{id}/pause).
func (c *Client) PauseSchedule(ctx context.Context, id int64) (*Schedule, error) {
	return c.scheduleCall(ctx, id, "/pause")
}

// ResumeSchedule resumes a schedule (POST /v1/schedules/{id}/resume).
func (c *Client) ResumeSchedule(ctx context.Context, id int64) (*Schedule, error) {
	return c.scheduleCall(ctx, id, "/resume")
}

func (c *Client) scheduleCall(ctx context.Context, id int64, suffix string) (*Schedule, error) {
	var s Schedule
	if _, err := c.do(ctx, http.MethodPost, "/v1/schedules/"+strconv.FormatInt(id, 10)+suffix, nil, nil, &s, 0); err != nil {
		return nil, err
	}
	return &s, nil
}

// PauseRun pauses a run (POST /v1/runs/{id}/pause).
func (c *Client) PauseRun(ctx context.Context, id int64) (*Run, error) {
	return c.runCall(ctx, id, "/pause")
}

// ResumeRun resumes a paused run (POST /v1/runs/{id}/resume).
func (c *Client) ResumeRun(ctx context.Context, id int64) (*Run, error) {
	return c.runCall(ctx, id, "/resume")
}

// RetryRun runs a failed or cancelled run again from where it failed
// (POST /v1/runs/{id}/retry); see Backend.
func (c *Client) RetryRun(ctx context.Context, id int64) (*Run, error) {
	return c.runCall(ctx, id, "/retry")
}

func (c *Client) runCall(ctx context.Context, id int64, suffix string) (*Run, error) {
	var r Run
	if _, err := c.do(ctx, http.MethodPost, "/v1/runs/"+strconv.FormatInt(id, 10)+suffix, nil, nil, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// PauseWorkflow pauses a workflow (POST /v1/workflows/{name}/pause); with
// runs, its active runs too.
func (c *Client) PauseWorkflow(ctx context.Context, name string, runs bool) (*WorkflowInfo, error) {
	return c.workflowCall(ctx, name, "/pause", runs)
}

// ResumeWorkflow resumes a workflow (POST /v1/workflows/{name}/resume);
// with runs, its paused runs too.
func (c *Client) ResumeWorkflow(ctx context.Context, name string, runs bool) (*WorkflowInfo, error) {
	return c.workflowCall(ctx, name, "/resume", runs)
}

func (c *Client) workflowCall(ctx context.Context, name, suffix string, runs bool) (*WorkflowInfo, error) {
	var q url.Values
	if runs {
		q = url.Values{"runs": {"true"}}
	}
	var w WorkflowInfo
	if _, err := c.do(ctx, http.MethodPost, "/v1/workflows/"+url.PathEscape(name)+suffix, q, nil, &w, 0); err != nil {
		return nil, err
	}
	return &w, nil
}
