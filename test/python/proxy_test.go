package python_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// faultProxy stands between a worker and the server and misbehaves as a
// loaded or flaky server would: it answers the first claims with 503
// and 429 (Retry-After: 1), drops the first claim answer that carries
// tasks after the server committed it (the connection breaks: the
// worker never learns what it was handed), and answers the first
// complete call with 503 (Retry-After: 1). It records when each claim
// and complete call arrived.
type faultProxy struct {
	upstream string
	client   *http.Client
	url      string

	mu        sync.Mutex
	claims    []time.Time // arrival of every claim call
	completes []time.Time // arrival of every complete call
	dropped   []int64     // tasks of the claim answer it dropped
}

// refusedClaims are the statuses of the first claim calls, in order.
var refusedClaims = []int{http.StatusServiceUnavailable, http.StatusTooManyRequests}

func startProxy(t *testing.T, upstream string) *faultProxy {
	t.Helper()
	tr := &http.Transport{}
	p := &faultProxy{upstream: upstream, client: &http.Client{Transport: tr}}
	srv := httptest.NewServer(p)
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	p.url = srv.URL
	return p
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	claim := r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/claim")
	complete := r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/complete")
	p.mu.Lock()
	refuse := 0
	switch {
	case claim:
		p.claims = append(p.claims, now)
		if n := len(p.claims); n <= len(refusedClaims) {
			refuse = refusedClaims[n-1]
		}
	case complete:
		p.completes = append(p.completes, now)
		if len(p.completes) == 1 {
			refuse = http.StatusServiceUnavailable
		}
	}
	dropNext := claim && refuse == 0 && p.dropped == nil
	p.mu.Unlock()
	if refuse != 0 {
		code := map[int]string{http.StatusServiceUnavailable: "not_ready", http.StatusTooManyRequests: "admission_rejected"}[refuse]
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(refuse)
		_, _ = io.WriteString(w, `{"error":{"code":"`+code+`","message":"the test's proxy says: come back in a second"}}`)
		return
	}

	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.upstream+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if dropNext && resp.StatusCode == http.StatusOK {
		var ans struct {
			Tasks []struct {
				ID int64 `json:"id"`
			} `json:"tasks"`
		}
		if json.Unmarshal(body, &ans) == nil && len(ans.Tasks) > 0 {
			p.mu.Lock()
			for _, tk := range ans.Tasks {
				p.dropped = append(p.dropped, tk.ID)
			}
			p.mu.Unlock()
			// The server committed the claim; the worker gets a broken
			// connection instead of its answer.
			panic(http.ErrAbortHandler)
		}
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, bytes.NewReader(body))
}

// calls returns copies of what the proxy recorded.
func (p *faultProxy) calls() (claims, completes []time.Time, dropped []int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.claims...), append([]time.Time(nil), p.completes...), append([]int64(nil), p.dropped...)
}
