package sluice

import (
	"context"
	"net/http"
	"time"
)

// doctorTimeout bounds a doctor call: its checks read every counted row
// (about a second on a million tasks, docs/operations.md).
const doctorTimeout = 10 * time.Minute

// Doctor recomputes every counter from the rows it counts and reports
// what is wrong (GET /v1/doctor); see DoctorReport.
func (c *Client) Doctor(ctx context.Context) (*DoctorReport, error) {
	var r DoctorReport
	if _, err := c.do(ctx, http.MethodGet, "/v1/doctor", nil, nil, &r, doctorTimeout); err != nil {
		return nil, err
	}
	return &r, nil
}

// RepairCounters sets every counter that differs from its rows to the
// number they give, in one write transaction, and reports what it
// changed and what the checks find after it (POST /v1/doctor/repair).
func (c *Client) RepairCounters(ctx context.Context) (*DoctorReport, error) {
	var r DoctorReport
	if _, err := c.do(ctx, http.MethodPost, "/v1/doctor/repair", nil, nil, &r, doctorTimeout); err != nil {
		return nil, err
	}
	return &r, nil
}
