package sluice

import (
	"context"
	"net/http"
)

// Environment returns the environment limit, the admission ceiling and
// what counts against each (GET /v1/environment).
func (c *Client) Environment(ctx context.Context) (*Environment, error) {
	var env Environment
	if _, err := c.do(ctx, http.MethodGet, "/v1/environment", nil, nil, &env, 0); err != nil {
		return nil, err
	}
	return &env, nil
}
