package kinds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice"
)

type httpInput struct {
	URL     string            `json:"url"`
	Method  string            `json:"method"`
	Headers map[string]string `json:"headers"`
	Body    *string           `json:"body"`
	Timeout *string           `json:"timeout"`
}

type httpOutput struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
	// Truncated is set when the body passed MaxOutput bytes.
	Truncated bool `json:"truncated,omitempty"`
}

const defaultHTTPTimeout = 30 * time.Second

// httpHandler sends one HTTP request. A 2xx answer succeeds with
// {"status", "body"}; 408, 429 and 5xx fail the attempt (retried, after
// Retry-After when the server sent one); any other status fails the task
// without retry; a network error is retried.
func httpHandler(hc *http.Client) sluice.HandlerFunc {
	return func(ctx context.Context, t *sluice.TaskContext) (json.RawMessage, error) {
		req, timeout, err := buildRequest(t.Input)
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req = req.WithContext(rctx)
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("http: %s %s: no answer within %s", req.Method, req.URL.Redacted(), timeout)
			}
			return nil, fmt.Errorf("http: %w", err)
		}
		defer resp.Body.Close()
		var body cappedBuffer
		if _, err := io.Copy(&body, io.LimitReader(resp.Body, MaxOutput+1)); err != nil {
			return nil, fmt.Errorf("http: %s %s: reading body: %w", req.Method, req.URL.Redacted(), err)
		}
		out := httpOutput{Status: resp.StatusCode, Body: body.buf.String(), Truncated: body.truncated}
		switch code := resp.StatusCode; {
		case code >= 200 && code <= 299:
			return json.Marshal(out)
		case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
			err := fmt.Errorf("http: %s %s: %s%s", req.Method, req.URL.Redacted(), resp.Status, snippet(out.Body))
			if d := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); d > 0 {
				return nil, sluice.RetryAfter(err, d)
			}
			return nil, err
		default:
			return nil, sluice.NoRetry(fmt.Errorf("http: %s %s: %s%s", req.Method, req.URL.Redacted(), resp.Status, snippet(out.Body)))
		}
	}
}

// buildRequest validates the input and builds the request, without a
// context: the handler adds its own, and validateHTTP builds the request
// only to check that it can be built.
func buildRequest(raw json.RawMessage) (*http.Request, time.Duration, error) {
	var in httpInput
	if err := decodeInput("http", raw, &in); err != nil {
		return nil, 0, err
	}
	if in.URL == "" {
		return nil, 0, badInput("http", "url", "required")
	}
	u, err := url.Parse(in.URL)
	if err != nil {
		return nil, 0, badInput("http", "url", "%v", err)
	}
	if s := strings.ToLower(u.Scheme); (s != "http" && s != "https") || u.Host == "" {
		return nil, 0, badInput("http", "url", "want an absolute http or https URL, got %q", in.URL)
	}
	method := in.Method
	if method == "" {
		method = http.MethodGet
	}
	if !validToken(method) {
		return nil, 0, badInput("http", "method", "invalid method %q", method)
	}
	timeout, err := duration("http", "timeout", in.Timeout, defaultHTTPTimeout)
	if err != nil {
		return nil, 0, err
	}
	if timeout == 0 {
		return nil, 0, badInput("http", "timeout", "must be positive")
	}
	var body io.Reader
	if in.Body != nil {
		body = strings.NewReader(*in.Body)
	}
	req, err := http.NewRequest(method, u.String(), body)
	if err != nil {
		return nil, 0, badInput("http", "url", "%v", err)
	}
	for k, v := range in.Headers {
		if !validToken(k) {
			return nil, 0, badInput("http", "headers", "invalid header name %q", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, 0, badInput("http", "headers", "invalid value for header %q", k)
		}
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	return req, timeout, nil
}

// validToken reports whether s is an HTTP token (RFC 9110 §5.6.2), as
// methods and header names must be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date.
// It returns 0 when the header is absent, unreadable or in the past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Duration(max(n, 0)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
