package pipefile

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func openTestFolder(t *testing.T) *Folder {
	t.Helper()
	f, err := OpenFolder(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestClaimHoldsALockedFIFO(t *testing.T) {
	f := openTestFolder(t)
	fd, ok, err := f.Claim(3)
	if err != nil || !ok {
		t.Fatalf("Claim: %v %v", ok, err)
	}
	defer unix.Close(fd)
	st, err := f.Stat(3)
	if err != nil || !IsFIFO(&st) {
		t.Fatalf("unit-3 is not a FIFO: %v", err)
	}
	if !f.Held(3) {
		t.Fatal("the claim is not held")
	}
	if _, _, held, err := f.TryLock(3); !held || err != nil {
		t.Fatalf("TryLock of a held claim: held=%v %v", held, err)
	}
	// The descriptor survives exec.
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC != 0 {
		t.Fatalf("claim descriptor is close-on-exec (flags %#x, %v)", flags, err)
	}
	// Only the unit name is left: the temporary name is gone.
	ents, _ := os.ReadDir(f.Path())
	if len(ents) != 1 || ents[0].Name() != "unit-3" {
		t.Fatalf("folder holds %v", ents)
	}
	// A second claim of the unit finds it taken and leaves nothing.
	if fd2, ok, err := f.Claim(3); ok || err != nil || fd2 != -1 {
		t.Fatalf("second Claim: fd %d ok %v err %v", fd2, ok, err)
	}
	if ents, _ := os.ReadDir(f.Path()); len(ents) != 1 {
		t.Fatalf("folder holds %v after a taken claim", ents)
	}
	f.Unclaim(3, fd)
	if _, err := f.Stat(3); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("unit-3 after Unclaim: %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatal("descriptor still open after Unclaim")
	}
}

func TestTryLock(t *testing.T) {
	f := openTestFolder(t)
	target := filepath.Join(t.TempDir(), "target")
	if err := unix.Mkfifo(target, 0o600); err != nil {
		t.Fatal(err)
	}
	plant := map[int]func(p string) error{
		0: func(p string) error { return unix.Mkfifo(p, 0o600) },
		1: func(p string) error { return os.WriteFile(p, []byte("x"), 0o644) },
		2: func(p string) error { return os.Symlink(target, p) },
		3: func(p string) error { return os.Mkdir(p, 0o755) },
		4: func(p string) error {
			ln, err := net.Listen("unix", p)
			if err == nil {
				t.Cleanup(func() { ln.Close() })
			}
			return err
		},
	}
	for u, mk := range plant {
		if err := mk(filepath.Join(f.Path(), UnitName(u))); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		u    int
		err  error
	}{
		{"unlocked FIFO", 0, nil},
		{"regular file", 1, ErrNotFIFO},
		{"symlink to a FIFO", 2, ErrNotFIFO},
		{"folder", 3, ErrNotFIFO},
		{"socket", 4, ErrNotFIFO},
		{"nothing", 5, unix.ENOENT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, _, held, err := f.TryLock(tc.u)
			if !errors.Is(err, tc.err) || held {
				t.Fatalf("TryLock: held=%v err=%v, want %v", held, err, tc.err)
			}
			if err != nil {
				if fd != -1 {
					t.Fatalf("fd %d with an error", fd)
				}
				return
			}
			// The lock is taken: nobody else gets it until the descriptor goes.
			if !f.Held(tc.u) {
				t.Fatal("TryLock did not take the lock")
			}
			unix.Close(fd)
			if f.Held(tc.u) {
				t.Fatal("lock kept after close")
			}
		})
	}
	// The symlink's target was never opened for a lock.
	fd, err := unix.Open(target, unix.O_RDWR|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("symlink target locked: %v", err)
	}
}

func TestOpenFolderRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	os.Symlink(t.TempDir(), link)
	if _, err := OpenFolder(link); err == nil {
		t.Fatal("OpenFolder followed a symlink")
	}
	if _, err := OpenFolder(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing folder: %v", err)
	}
}
