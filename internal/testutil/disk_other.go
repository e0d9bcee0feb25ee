//go:build !linux

package testutil

import "testing"

// SmallDisk skips the test: mounting a small file system is done on
// Linux only.
func SmallDisk(t testing.TB, size int) string {
	t.Helper()
	t.Skip("no small file system to fill: mounting a tmpfs is done on Linux only")
	return ""
}
