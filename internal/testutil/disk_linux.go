//go:build linux

package testutil

import (
	"strconv"
	"syscall"
	"testing"
)

// SmallDisk mounts a tmpfs of size bytes on a new temporary directory
// for the test and returns the directory: a file system a test can fill.
// It skips the test where mounting is not allowed (it needs
// CAP_SYS_ADMIN: root, outside an unprivileged container). The file
// system is unmounted when the test ends, after the cleanups registered
// later (a store opened on it closes first).
func SmallDisk(t testing.TB, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+strconv.Itoa(size)); err != nil {
		t.Skipf("no small file system to fill: mounting a tmpfs needs CAP_SYS_ADMIN: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}
