package store_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// An outage is one state: however many calls fail, or commit, at once,
// the watcher sees it begin once (with the first error) and end once,
// in that order; errors not marked Unavailable do not begin one.
func TestHealth(t *testing.T) {
	t.Parallel()
	var h store.Health
	require.NoError(t, h.Err(), "the zero value is healthy")
	h.OK()

	var mu sync.Mutex
	var seen []error
	h.Watch(func(down error) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, down)
	})

	for _, err := range []error{
		errors.New("UNIQUE constraint failed"),
		sluice.NotFound("task 1 not found"),
		&sluice.AdmissionError{Ceiling: "x"},
		nil,
	} {
		h.Fail(err)
		require.NoError(t, h.Err(), "%v", err)
	}
	require.Empty(t, seen)

	full := store.Unavailable(errors.New("database or disk is full"))
	for round := range 3 {
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				if i == 0 {
					h.Fail(full)
				} else {
					h.Fail(fmt.Errorf("claiming: %w", store.Unavailable(errors.New("another"))))
				}
			})
		}
		wg.Wait()
		require.Error(t, h.Err())
		require.ErrorIs(t, h.Err(), sluice.ErrStoreUnavailable)
		for range 50 {
			wg.Go(h.OK)
		}
		wg.Wait()
		require.NoError(t, h.Err())
		mu.Lock()
		require.Len(t, seen, 2*(round+1), "one beginning and one end per outage")
		require.Error(t, seen[2*round])
		require.NoError(t, seen[2*round+1])
		mu.Unlock()
	}

	h.Watch(nil)
	h.Fail(full)
	require.Equal(t, full, h.Err(), "the first error of the outage")
	h.Fail(store.Unavailable(errors.New("later")))
	require.Equal(t, full, h.Err())
	require.Len(t, seen, 6, "no watcher")
}
