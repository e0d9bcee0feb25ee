package sluice

import (
	"context"
	"net/http"
	"net/url"
)

// The worker protocol's calls (the types are in package protocol). A
// worker written in Go uses them through Worker; they are exported so a
// Client satisfies Backend.

// RegisterWorker registers a worker (POST /v1/workers).
func (c *Client) RegisterWorker(ctx context.Context, p RegisterWorkerParams) (*WorkerRegistration, error) {
	var r WorkerRegistration
	if _, err := c.do(ctx, http.MethodPost, "/v1/workers", nil, p, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// Claim claims up to p.Max tasks, long-polling up to p.Wait when none is
// claimable (POST /v1/workers/{id}/claim).
func (c *Client) Claim(ctx context.Context, workerID string, p ClaimParams) (*ClaimResult, error) {
	var r ClaimResult
	if _, err := c.do(ctx, http.MethodPost, workerPath(workerID, "/claim"), nil, p, &r, p.Wait.D()+claimSlack); err != nil {
		return nil, err
	}
	return &r, nil
}

// Complete reports finished attempts (POST /v1/workers/{id}/complete).
func (c *Client) Complete(ctx context.Context, workerID string, p CompleteParams) (*CompleteResult, error) {
	var r CompleteResult
	if _, err := c.do(ctx, http.MethodPost, workerPath(workerID, "/complete"), nil, p, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// Heartbeat extends the leases of held tasks and reports capacity
// (POST /v1/workers/{id}/heartbeat).
func (c *Client) Heartbeat(ctx context.Context, workerID string, p HeartbeatParams) (*HeartbeatResult, error) {
	var r HeartbeatResult
	if _, err := c.do(ctx, http.MethodPost, workerPath(workerID, "/heartbeat"), nil, p, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// Release hands claimed tasks back unstarted; they are not counted as
// attempts (POST /v1/workers/{id}/release).
func (c *Client) Release(ctx context.Context, workerID string, p ReleaseParams) error {
	_, err := c.do(ctx, http.MethodPost, workerPath(workerID, "/release"), nil, p, nil, 0)
	return err
}

// DeregisterWorker removes a worker (DELETE /v1/workers/{id}).
func (c *Client) DeregisterWorker(ctx context.Context, workerID string) error {
	_, err := c.do(ctx, http.MethodDelete, workerPath(workerID, ""), nil, nil, nil, 0)
	return err
}

func workerPath(id, suffix string) string {
	return "/v1/workers/" + url.PathEscape(id) + suffix
}
