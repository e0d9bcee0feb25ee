package sluice

import (
	"context"
	"net/http"
	"strconv"
)

// RetryTask sends a failed or cancelled task back to its queue (POST
// /v1/tasks/{id}/retry), same id, with a fresh budget of attempts; see
// Backend.RetryTask. A task that has not ended, a succeeded task and a
// task of a workflow run are an ErrConflict; over an admission ceiling it
// is an *AdmissionError and nothing changes.
func (c *Client) RetryTask(ctx context.Context, id int64) (*Task, error) {
	var t Task
	if _, err := c.do(ctx, http.MethodPost, "/v1/tasks/"+strconv.FormatInt(id, 10)+"/retry", nil, nil, &t, 0); err != nil {
		return nil, err
	}
	return &t, nil
}
