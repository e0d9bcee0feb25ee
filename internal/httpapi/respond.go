package httpapi

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-dev/sluice"
)

// errorBody is the error envelope: {"error": {"code", "message", "field"}}.
type errorBody struct {
	Error *sluice.Error `json:"error"`
}

// answerBufs are writeJSON's buffers, reused across answers.
var answerBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledAnswer caps the buffers kept for reuse, so one large answer
// (a long task list) does not stay allocated.
const maxPooledAnswer = 1 << 20

// writeJSON answers status with v as JSON. It encodes into a buffer first so
// that an encoding failure can still become a 500.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	buf := answerBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledAnswer {
			buf.Reset()
			answerBufs.Put(buf)
		}
	}()
	if err := encodeAnswer(buf, v); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
	return nil
}

func writeError(w http.ResponseWriter, status int, e *sluice.Error) {
	// An *sluice.Error always encodes.
	_ = writeJSON(w, status, errorBody{Error: e})
}

// statusOf maps an API error code to its HTTP status; ok is false for an
// unknown code.
func statusOf(code string) (status int, ok bool) {
	switch code {
	case sluice.CodeBadRequest:
		return http.StatusBadRequest, true
	case sluice.CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge, true
	case sluice.CodeUnauthorized:
		return http.StatusUnauthorized, true
	case sluice.CodeForbidden:
		return http.StatusForbidden, true
	case sluice.CodeNotFound:
		return http.StatusNotFound, true
	case sluice.CodeConflict, sluice.CodeConcurrencyFull, sluice.CodeRecursiveWaitDeadlock:
		return http.StatusConflict, true
	case sluice.CodeAdmission:
		return http.StatusTooManyRequests, true
	case sluice.CodeNotReady, sluice.CodeStoreUnavailable:
		return http.StatusServiceUnavailable, true
	}
	return 0, false
}

// StoreUnavailableRetryAfter is the Retry-After of a 503 store_unavailable:
// a database restart or failover takes seconds, and clients back off
// further on their own.
const StoreUnavailableRetryAfter = time.Second

// retryAfterSeconds renders d as a Retry-After value: whole seconds, rounded
// up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := math.Ceil(d.Seconds())
	if s < 1 || math.IsNaN(s) {
		s = 1
	}
	if s > 86400 {
		s = 86400
	}
	return strconv.Itoa(int(s))
}

// writeErr maps err to a status and the error envelope. A store that
// cannot reach its database (sluice.ErrStoreUnavailable) is answered 503
// store_unavailable with Retry-After, so that clients and load balancers
// can tell an outage from a bug. Other errors that are not *sluice.Error
// or *sluice.AdmissionError are logged and answered with a bare 500
// "internal". Neither answer says more: internals (SQL, addresses, paths)
// never leak.
func (a *api) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	var tooLarge *errBodyTooLarge
	if errors.As(err, &tooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, &sluice.Error{Code: sluice.CodePayloadTooLarge, Message: tooLarge.Error()})
		return
	}
	if ae, ok := sluice.IsAdmission(err); ok {
		w.Header().Set("Retry-After", retryAfterSeconds(ae.RetryAfter))
		writeError(w, http.StatusTooManyRequests, &sluice.Error{Code: sluice.CodeAdmission, Message: ae.Error()})
		return
	}
	var se *sluice.Error
	if errors.Is(err, sluice.ErrStoreUnavailable) {
		e := &sluice.Error{Code: sluice.CodeStoreUnavailable, Message: "the server cannot reach its database; retry later"}
		if errors.As(err, &se) && se.Code == sluice.CodeStoreUnavailable && se.Message != "" {
			e = se // an API error, meant for clients
		} else {
			// The store's own error: an outage, not a bug. The engine
			// logs the outage once when it begins and once when it
			// ends (a full disk fails thousands of calls a second), so
			// each call is only a debug line; the details stay there.
			a.log.LogAttrs(r.Context(), slog.LevelDebug, "http request failed: store unavailable",
				slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("err", err))
		}
		w.Header().Set("Retry-After", retryAfterSeconds(StoreUnavailableRetryAfter))
		writeError(w, http.StatusServiceUnavailable, e)
		return
	}
	if errors.As(err, &se) {
		if status, ok := statusOf(se.Code); ok {
			if status == http.StatusTooManyRequests {
				w.Header().Set("Retry-After", "1")
			}
			writeError(w, status, se)
			return
		}
	}
	ctx := r.Context()
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		// The client went away (e.g. during a long-poll claim): nobody
		// reads the answer, and it is not a server fault worth an error log.
		a.log.DebugContext(ctx, "request cancelled", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, &sluice.Error{Code: sluice.CodeNotReady, Message: "request cancelled"})
		return
	}
	a.log.LogAttrs(ctx, slog.LevelError, "http request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("err", err))
	writeError(w, http.StatusInternalServerError, &sluice.Error{Code: sluice.CodeInternal, Message: "internal error; the server log has details"})
}
