package sluice

import (
	"context"
	"net/http"
	"strconv"
)

// TriggerChild creates a child of the task parentID that workerID runs
// (POST /v1/workers/{wid}/tasks/{id}/children); created is false when the
// parent's call position had its child already. Inside a handler, use the
// package function TriggerChild, which knows the worker and the task.
func (c *Client) TriggerChild(ctx context.Context, workerID string, parentID int64, p ChildParams) (*ChildResult, bool, error) {
	var r ChildResult
	status, err := c.do(ctx, http.MethodPost, childPath(workerID, parentID, "/children"), nil, p, &r, 0)
	if err != nil {
		return nil, false, err
	}
	return &r, status == http.StatusCreated, nil
}

// WaitChild waits up to p.Wait for the parent's child to end and the
// parent to have its slots back (POST /v1/workers/{wid}/tasks/{id}/wait).
// A wait the parent's queue cannot grant is an *Error matching
// ErrRecursiveWaitDeadlock.
func (c *Client) WaitChild(ctx context.Context, workerID string, parentID int64, p WaitChildParams) (*WaitChildResult, error) {
	var r WaitChildResult
	if _, err := c.do(ctx, http.MethodPost, childPath(workerID, parentID, "/wait"), nil, p, &r, p.Wait.D()+claimSlack); err != nil {
		return nil, err
	}
	return &r, nil
}

func childPath(workerID string, parentID int64, suffix string) string {
	return workerPath(workerID, "/tasks/"+strconv.FormatInt(parentID, 10)+suffix)
}
