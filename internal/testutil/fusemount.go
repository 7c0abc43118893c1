package testutil

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// MountOthersFUSE mounts at path a FUSE file system of uid 65534 that
// answers nothing, as a local user may with fusermount3 on a folder or file
// of their own: the kernel then refuses every other user, root included, any
// look at path (EACCES) without asking the file system. The test is skipped
// where it cannot mount (not root, no /dev/fuse). Cleanup detaches the mount
// if it is still there.
func MountOthersFUSE(t testing.TB, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a FUSE file system as another user; runs as", os.Geteuid())
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skip("no /dev/fuse:", err)
	}
	// The root's type must be the mount point's.
	rootmode := unix.S_IFDIR
	var st unix.Stat_t
	if unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		rootmode = unix.S_IFREG
	}
	opts := fmt.Sprintf("fd=%d,rootmode=%o,user_id=65534,group_id=65534", fd, rootmode)
	if err := unix.Mount("gpulet-test", path, "fuse.gpulet-test", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		t.Skip("cannot mount FUSE here:", err)
	}
	t.Cleanup(func() {
		unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		unix.Close(fd)
	})
}
