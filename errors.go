package sluice

import (
	"errors"
	"fmt"
	"time"
)

// Error codes carried by *Error and the HTTP API's {"error": {"code"}}.
const (
	CodeBadRequest   = "bad_request"
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeAdmission    = "admission_rejected"
	CodeNotReady     = "not_ready"
	// CodePayloadTooLarge: the request body is over the server's limit
	// (HTTP 413; the server's --max-body-bytes, 1 MiB by default).
	// Nothing was done.
	CodePayloadTooLarge = "payload_too_large"
	// CodeConcurrencyFull: a trigger for a full sub-queue of a queue with
	// strategy cancel_newest, or a run of a workflow whose concurrency
	// key is full under strategy cancel_newest, was rejected (HTTP 409);
	// nothing was created.
	CodeConcurrencyFull = "concurrency_full"
	// CodeStoreUnavailable: the server cannot reach its database (connection
	// refused or lost, the database shutting down or starting up). The HTTP
	// API answers 503 with Retry-After; the call may succeed when retried.
	CodeStoreUnavailable = "store_unavailable"
	CodeInternal         = "internal"
)

// Error is an API error with a stable code. Field names the offending input
// field, when there is one.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// RetryAfter is how long the server asked to wait before calling
	// again: its Retry-After header, which a 503 store_unavailable
	// carries (the Go client sets it; a Worker waits at least that long
	// before its next claim or complete). Zero when the answer had none,
	// and on errors of a Backend in process.
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Is makes errors.Is(err, ErrNotFound) match any *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// Sentinel errors for errors.Is.
var (
	ErrNotFound = &Error{Code: CodeNotFound}
	ErrConflict = &Error{Code: CodeConflict}
	ErrInvalid  = &Error{Code: CodeBadRequest}
	// ErrConcurrencyFull matches a trigger or a run start rejected by the
	// strategy cancel_newest (CodeConcurrencyFull).
	ErrConcurrencyFull = &Error{Code: CodeConcurrencyFull}
	// ErrStoreUnavailable matches an error from a call that failed because
	// the server's database could not be reached, whether it comes from the
	// HTTP API (code store_unavailable) or from a server's Backend in
	// process. The call did nothing, or, when the connection broke while it
	// ran, its outcome is unknown: retry it, with an idempotency key where
	// running it twice matters.
	ErrStoreUnavailable = &Error{Code: CodeStoreUnavailable}
)

// Invalid returns a bad-request error naming field.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: CodeBadRequest, Field: field, Message: field + ": " + fmt.Sprintf(format, args...)}
}

// NotFound returns a not-found error.
func NotFound(format string, args ...any) *Error {
	return &Error{Code: CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

// Conflict returns a conflict error.
func Conflict(format string, args ...any) *Error {
	return &Error{Code: CodeConflict, Message: fmt.Sprintf(format, args...)}
}

// AdmissionError rejects a trigger over an admission ceiling.
// Nothing was created. The HTTP API answers 429 with Retry-After.
type AdmissionError struct {
	// Ceiling names what is full, e.g. `environment max_active 1000` or
	// `queue "email" max_backlog 50`.
	Ceiling    string
	RetryAfter time.Duration
}

func (e *AdmissionError) Error() string {
	return fmt.Sprintf("admission rejected: %s reached; retry after %s", e.Ceiling, e.RetryAfter)
}

// IsAdmission reports whether err is an *AdmissionError and returns it.
func IsAdmission(err error) (*AdmissionError, bool) {
	var ae *AdmissionError
	ok := errors.As(err, &ae)
	return ae, ok
}
