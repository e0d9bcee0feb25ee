package sluice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Client talks to a sluice server over its HTTP API (/v1). It implements
// Backend, so a Worker can run against it. A Client is safe for concurrent
// use; create one per server and reuse it.
type Client struct {
	bases []string     // scheme://host[/prefix], no trailing slash
	cur   atomic.Int64 // index of the base in use
	token string
	hc    *http.Client
}

var _ Backend = (*Client)(nil)

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithToken sends token as a bearer token on every request. The default is
// no Authorization header (a server in dev mode).
func WithToken(token string) ClientOption {
	return func(c *Client) { c.token = token }
}

// WithHTTPClient replaces the default HTTP client (keep-alive transport with
// 64 idle connections per host and no overall timeout; each request has its
// own deadline). A client with a Timeout shorter than the claim long-poll
// (up to 60s) breaks idle workers.
func WithHTTPClient(hc *http.Client) ClientOption {
	return func(c *Client) { c.hc = hc }
}

// Request deadlines applied when the caller's context has none sooner.
const (
	requestTimeout = 60 * time.Second
	// claimSlack is added to a claim's long-poll wait.
	claimSlack = 15 * time.Second
)

// NewClient returns a client for the server at baseURL, e.g.
// "http://localhost:8080". A trailing slash is ignored. baseURL may list
// several replicas of one cluster separated by commas
// ("http://a:8080,http://b:8080"): the client uses one at a time and fails
// over to the next when a connection cannot be made (the request surely
// did not reach the server, so it is retried at once on the next replica)
// or breaks mid-request (the error is returned, and the next call goes to
// the next replica).
func NewClient(baseURL string, opts ...ClientOption) *Client {
	c := &Client{}
	for _, b := range strings.Split(baseURL, ",") {
		if b = strings.TrimRight(strings.TrimSpace(b), "/"); b != "" {
			c.bases = append(c.bases, b)
		}
	}
	if len(c.bases) == 0 {
		c.bases = []string{""}
	}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: newTransport()}
	}
	return c
}

// newTransport is tuned for a worker that claims, completes and heartbeats
// concurrently on a few connections.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
}

// Trigger creates a task (POST /v1/tasks). created is false when the
// idempotency key matched an existing task, or when p.Debounce (or the
// queue's debounce) merged the trigger into a pending debounced task:
// that task is returned, with this input and a later start, and
// Debounced set.
func (c *Client) Trigger(ctx context.Context, p TriggerParams) (*Task, bool, error) {
	var t Task
	status, err := c.do(ctx, http.MethodPost, "/v1/tasks", nil, p, &t, 0)
	if err != nil {
		return nil, false, err
	}
	return &t, status == http.StatusCreated, nil
}

// TriggerBatch creates tasks atomically (POST /v1/tasks/batch).
func (c *Client) TriggerBatch(ctx context.Context, p TriggerBatchParams) (*TriggerBatchResult, error) {
	var r TriggerBatchResult
	if _, err := c.do(ctx, http.MethodPost, "/v1/tasks/batch", nil, p, &r, 0); err != nil {
		return nil, err
	}
	return &r, nil
}

// GetTask returns a task with its attempts (GET /v1/tasks/{id}).
func (c *Client) GetTask(ctx context.Context, id int64) (*Task, error) {
	var t Task
	if _, err := c.do(ctx, http.MethodGet, "/v1/tasks/"+strconv.FormatInt(id, 10), nil, nil, &t, 0); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTasks returns one page of tasks, newest first (GET /v1/tasks).
func (c *Client) ListTasks(ctx context.Context, f TaskFilter) (*TaskPage, error) {
	q := url.Values{}
	if f.State != "" {
		q.Set("state", string(f.State))
	}
	if f.Queue != "" {
		q.Set("queue", f.Queue)
	}
	if f.Kind != "" {
		q.Set("kind", f.Kind)
	}
	if f.ConcurrencyKey != "" {
		q.Set("concurrency_key", f.ConcurrencyKey)
	}
	if f.RunID != 0 {
		q.Set("run_id", strconv.FormatInt(f.RunID, 10))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	if f.After != "" {
		q.Set("after", f.After)
	}
	var page TaskPage
	if _, err := c.do(ctx, http.MethodGet, "/v1/tasks", q, nil, &page, 0); err != nil {
		return nil, err
	}
	return &page, nil
}

// CancelTask requests cancellation of a task (POST /v1/tasks/{id}/cancel).
func (c *Client) CancelTask(ctx context.Context, id int64) (*Task, error) {
	var t Task
	if _, err := c.do(ctx, http.MethodPost, "/v1/tasks/"+strconv.FormatInt(id, 10)+"/cancel", nil, nil, &t, 0); err != nil {
		return nil, err
	}
	return &t, nil
}

// PutQueue creates a queue or changes the settings p sends (PUT
// /v1/queues/{name}, a partial update): a field left out keeps its
// setting, Null clears it. For example
//
//	c.PutQueue(ctx, "email", sluice.QueueParams{ConcurrencyLimit: sluice.Set(5)})
//	c.PutQueue(ctx, "email", sluice.QueueParams{ConcurrencyLimit: sluice.Null[int]()})
//
// sets the limit to 5 and then removes it, leaving every other setting.
func (c *Client) PutQueue(ctx context.Context, name string, p QueueParams) (*Queue, error) {
	return c.queueCall(ctx, http.MethodPut, name, "", p)
}

// DeleteQueue deletes a queue that holds no unfinished task (DELETE
// /v1/queues/{name}); see Backend.DeleteQueue.
func (c *Client) DeleteQueue(ctx context.Context, name string) error {
	if name == "" {
		return Invalid("name", "required")
	}
	_, err := c.do(ctx, http.MethodDelete, "/v1/queues/"+url.PathEscape(name), nil, nil, nil, 0)
	return err
}

// GetQueue returns a queue with its counts per state (GET /v1/queues/{name}).
func (c *Client) GetQueue(ctx context.Context, name string) (*Queue, error) {
	return c.queueCall(ctx, http.MethodGet, name, "", nil)
}

// PauseQueue stops claims from a queue (POST /v1/queues/{name}/pause).
func (c *Client) PauseQueue(ctx context.Context, name string) (*Queue, error) {
	return c.queueCall(ctx, http.MethodPost, name, "/pause", nil)
}

// ResumeQueue undoes PauseQueue (POST /v1/queues/{name}/resume).
func (c *Client) ResumeQueue(ctx context.Context, name string) (*Queue, error) {
	return c.queueCall(ctx, http.MethodPost, name, "/resume", nil)
}

func (c *Client) queueCall(ctx context.Context, method, name, suffix string, body any) (*Queue, error) {
	if name == "" {
		return nil, Invalid("name", "required")
	}
	var q Queue
	if _, err := c.do(ctx, method, "/v1/queues/"+url.PathEscape(name)+suffix, nil, body, &q, 0); err != nil {
		return nil, err
	}
	return &q, nil
}

// ListQueues returns every queue (GET /v1/queues).
func (c *Client) ListQueues(ctx context.Context) ([]Queue, error) {
	var out struct {
		Queues []Queue `json:"queues"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/v1/queues", nil, nil, &out, 0); err != nil {
		return nil, err
	}
	return out.Queues, nil
}

// ListWorkers returns the registered workers (GET /v1/workers).
func (c *Client) ListWorkers(ctx context.Context) ([]WorkerInfo, error) {
	var out struct {
		Workers []WorkerInfo `json:"workers"`
	}
	if _, err := c.do(ctx, http.MethodGet, "/v1/workers", nil, nil, &out, 0); err != nil {
		return nil, err
	}
	return out.Workers, nil
}

// Wait polls the task until it is terminal and returns it. See the package
// function Wait.
func (c *Client) Wait(ctx context.Context, id int64) (*Task, error) {
	return Wait(ctx, c, id)
}

// Wait polls b until task id is terminal (succeeded, failed or cancelled)
// and returns it. Polls start 10ms apart and back off to 500ms. Errors that
// retrying cannot fix (not found, bad request, auth) return at once; others
// (network, server not ready, its database unreachable) are retried until
// ctx is done.
func Wait(ctx context.Context, b Backend, id int64) (*Task, error) {
	return WaitTask(ctx, b, id, nil)
}

// WaitTask is Wait that calls progress, if not nil, after each poll:
// with the task as read (err nil), or with the error of a read that it
// retries (t nil), which a read that succeeds later follows (`sluice
// enqueue --wait` prints its progress lines from it). Errors are retried
// as Wait retries them; one that ends the wait is returned, not passed to
// progress.
func WaitTask(ctx context.Context, b Backend, id int64, progress func(t *Task, err error)) (*Task, error) {
	var retrying func(error)
	if progress != nil {
		retrying = func(err error) { progress(nil, err) }
	}
	return poll(ctx, fmt.Sprintf("task %d", id), func() (*Task, bool, error) {
		t, err := b.GetTask(ctx, id)
		if err != nil {
			return nil, false, err
		}
		if progress != nil {
			progress(t, nil)
		}
		return t, t.State.Terminal(), nil
	}, retrying)
}

// permanent reports whether repeating the call cannot succeed.
func permanent(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case CodeNotReady, CodeStoreUnavailable, CodeInternal:
		return false
	}
	return true
}

// do sends one request. query may be nil; body, when not nil, is sent as
// JSON; out, when not nil, receives the JSON answer of a 2xx response.
// timeout, when positive, replaces requestTimeout.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body, out any, timeout time.Duration) (int, error) {
	if timeout <= 0 {
		timeout = requestTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var payload []byte
	ctype := "application/json"
	if rb, ok := body.(rawBody); ok {
		payload, ctype = rb.data, rb.contentType
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("sluice: encoding %s %s: %w", method, path, err)
		}
		payload = b
	}
	var resp *http.Response
	for tries := 0; ; tries++ {
		i := c.cur.Load()
		base := c.bases[int(i)%len(c.bases)]
		u := base + path
		if len(query) > 0 {
			u += "?" + query.Encode()
		}
		var rd io.Reader
		if payload != nil {
			rd = bytes.NewReader(payload)
		}
		req, err := http.NewRequestWithContext(ctx, method, u, rd)
		if err != nil {
			return 0, fmt.Errorf("sluice: %s %s: %w", method, path, err)
		}
		if body != nil {
			req.Header.Set("Content-Type", ctype)
		}
		req.Header.Set("Accept", "application/json")
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err = c.hc.Do(req)
		if err == nil {
			break
		}
		if len(c.bases) > 1 && ctx.Err() == nil {
			// Fail over: later calls go to the next replica.
			c.cur.CompareAndSwap(i, i+1)
			if isDialError(err) && tries+1 < len(c.bases) {
				continue // never reached the server: safe to retry at once
			}
		}
		return 0, newRequestError(method, path, err)
	}
	defer func() {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, decodeError(resp)
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		raw, err := io.ReadAll(resp.Body)
		if err == nil {
			err = decodeAnswer(raw, out)
		}
		if err != nil {
			return resp.StatusCode, fmt.Errorf("sluice: decoding answer to %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// rawBody is a request body sent as it is, with its content type.
type rawBody struct {
	data        []byte
	contentType string
}

// requestError is a request that got no HTTP answer (the server could not
// be reached, the connection broke, the deadline passed). Its message
// names the request once, with the URL tried:
//
//	sluice: GET http://127.0.0.1:8080/v1/tasks: dial tcp 127.0.0.1:8080: connect: connection refused
//
// and it wraps the *url.Error, so errors.As(err, new(*url.Error)),
// errors.As(err, new(*net.OpError)) and errors.Is(err,
// syscall.ECONNREFUSED) or context.DeadlineExceeded see through it.
type requestError struct {
	method string
	err    *url.Error // from http.Client.Do
}

func newRequestError(method, path string, err error) error {
	ue, ok := err.(*url.Error)
	if !ok {
		return fmt.Errorf("sluice: %s %s: %w", method, path, err)
	}
	return &requestError{method: method, err: ue}
}

func (e *requestError) Error() string {
	return "sluice: " + e.method + " " + e.err.URL + ": " + e.err.Err.Error()
}

func (e *requestError) Unwrap() error { return e.err }

// isDialError reports whether err means no connection was made, so the
// server cannot have seen the request.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// decodeError turns a non-2xx response into *Error (503 store_unavailable
// matches ErrStoreUnavailable), or *AdmissionError for 429, either with
// the answer's Retry-After.
func decodeError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var env struct {
		Error *Error `json:"error"`
	}
	e := &Error{}
	if json.Unmarshal(raw, &env) == nil && env.Error != nil {
		e = env.Error
	}
	if e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
	}
	if e.Message == "" {
		e.Message = resp.Status
		if s := strings.TrimSpace(string(raw)); s != "" {
			e.Message += ": " + truncate(s, 200)
		}
	}
	retryAfter := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	if resp.StatusCode == http.StatusTooManyRequests {
		// The server's message is AdmissionError.Error(): keep the ceiling.
		ceiling := strings.TrimPrefix(e.Message, "admission rejected: ")
		if i := strings.LastIndex(ceiling, " reached; retry after "); i >= 0 {
			ceiling = ceiling[:i]
		}
		return &AdmissionError{Ceiling: ceiling, RetryAfter: retryAfter}
	}
	e.RetryAfter = retryAfter
	return e
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return CodeBadRequest
	case http.StatusRequestEntityTooLarge:
		return CodePayloadTooLarge
	case http.StatusUnauthorized:
		return CodeUnauthorized
	case http.StatusForbidden:
		return CodeForbidden
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusTooManyRequests:
		return CodeAdmission
	case http.StatusServiceUnavailable:
		return CodeNotReady
	}
	return CodeInternal
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date.
// It returns 0 when the header is absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
