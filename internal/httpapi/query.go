package httpapi

import (
	"maps"
	"net/url"
	"slices"
	"strconv"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/validate"
)

// readQuery decodes the query string of a route. Each parameter may be
// given once, and an unknown one is an error, so that a typo
// ("stat=failed") does not silently list everything. param decodes one
// parameter and reports whether the route takes it; use lists those it
// takes, for the error. Parameters are read in sorted order, so that with
// several bad ones the one an error names does not vary.
func readQuery(rawQuery, use string, param func(k, v string) (known bool, err error)) error {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return &sluice.Error{Code: sluice.CodeBadRequest, Message: "malformed query string: " + err.Error()}
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q[k]
		if len(v) > 1 {
			return sluice.Invalid(clip(k), "given %d times; give it once", len(v))
		}
		known, err := param(k, v[0])
		if err != nil {
			return err
		}
		if !known {
			return sluice.Invalid(clip(k), "unknown query parameter: use %s", use)
		}
	}
	return nil
}

// listQuery decodes the query of a list (GET /v1/tasks, GET /v1/runs):
// the page parameters every list takes, limit and after, and the route's
// own filters through param (see readQuery). Only the decoding is done
// here: the backend checks the values (a known state, a cursor it made,
// a limit within its bound). A limit, given, is a positive integer: its
// zero value means "the default", which a query says by leaving it out.
func listQuery(rawQuery, use string, param func(k, v string) (bool, error)) (limit int, after string, err error) {
	err = readQuery(rawQuery, use, func(k, v string) (bool, error) {
		switch k {
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return true, sluice.Invalid("limit", "want an integer from 1 to %d, got %q", validate.MaxListLimit, clip(v))
			}
			limit = n
		case "after":
			after = v
		default:
			return param(k, v)
		}
		return true, nil
	})
	return limit, after, err
}
