package store

import (
	"errors"

	"github.com/sluice-dev/sluice"
)

// Unavailable marks err, an error a store's database driver returned, as
// meaning the database could not be reached: connection refused or lost,
// the server shutting down or starting up. errors.Is(err,
// sluice.ErrStoreUnavailable) then holds, so the HTTP API answers 503
// store_unavailable with Retry-After instead of 500 internal, while the
// message and errors.As still reach the driver's error (for the log).
// Which driver errors qualify is the backend's call, beside its queries;
// the rest of the server only tests for the sentinel. Unavailable returns
// nil for nil and err itself when it is already marked.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, sluice.ErrStoreUnavailable) {
		return err
	}
	return &unavailableError{err: err}
}

type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return "store unavailable: " + e.err.Error() }

func (e *unavailableError) Unwrap() error { return e.err }

// Is matches sluice.ErrStoreUnavailable as sluice.Error.Is does: any
// *sluice.Error with that code and no message.
func (e *unavailableError) Is(target error) bool {
	t, ok := target.(*sluice.Error)
	return ok && t.Code == sluice.CodeStoreUnavailable && t.Message == ""
}
