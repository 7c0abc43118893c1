package kubelet

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// heldClaim is an offline claim this test process holds.
type heldClaim struct{ fd int }

func (c heldClaim) Close() error { return unix.Close(c.fd) }

// claim claims the unit whose FIFO is path by the steps of docs/design.md §5.
func claim(t *testing.T, path string) heldClaim {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".claim-test")
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		t.Fatal(err)
	}
	defer unix.Unlink(tmp)
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := unix.Link(tmp, path); err != nil {
		t.Fatal(err)
	}
	return heldClaim{fd}
}
