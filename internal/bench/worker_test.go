package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The worker process gets the spec's result linger as --result-linger:
// "0" (off) for a negative one, nothing (its default) for zero.
func TestProcessWorkerResultLinger(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exe := filepath.Join(dir, "fake-sluice")
	// Records its arguments, then waits to be interrupted.
	require.NoError(t, os.WriteFile(exe, []byte("#!/bin/sh\necho \"$@\" > \"$0.args\"\ntrap 'exit 0' INT\nwhile :; do sleep 0.05; done\n"), 0o755))
	for _, tc := range []struct {
		linger time.Duration
		want   string // in the arguments; "" for no --result-linger
	}{
		{-1, "--result-linger 0"},
		{0, ""},
		{2 * time.Millisecond, "--result-linger 2ms"},
	} {
		_ = os.Remove(exe + ".args") // from the run before
		stop, err := Process(exe).Start(context.Background(), WorkerSpec{URL: "http://127.0.0.1:1", Slots: 3, ClaimBatch: 2, ResultLinger: tc.linger})
		require.NoError(t, err)
		_, err = stop()
		require.NoError(t, err)
		args, err := os.ReadFile(exe + ".args")
		require.NoError(t, err)
		require.Contains(t, string(args), "worker --server http://127.0.0.1:1 --slots 3")
		if tc.want == "" {
			require.NotContains(t, string(args), "--result-linger", tc.linger)
		} else {
			require.True(t, strings.Contains(string(args), tc.want), "args %q, want %q", args, tc.want)
		}
	}
}
