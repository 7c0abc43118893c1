package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/procfs"
)

// lockRunDir takes an exclusive lock on <run-dir>/gpuletd.lock for the life of
// the daemon, so that two daemons never share a ledger and a journal.
func lockRunDir(runDir string) (func() error, error) {
	path := filepath.Join(runDir, "gpuletd.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--run-dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another gpuletd%s is already running with --run-dir %s", lockHolder(f), runDir)
		}
		return nil, fmt.Errorf("--run-dir: locking %s: %w", path, err)
	}
	return f.Close, nil
}

// lockHolder names the process that holds f's lock, " (pid N)", as
// /proc/locks tells it, so that whoever started a second gpuletd knows which
// one to stop; empty when it cannot be told.
func lockHolder(f *os.File) string {
	var st syscall.Stat_t
	if syscall.Fstat(int(f.Fd()), &st) != nil {
		return ""
	}
	holders, err := procfs.FlockHolders()
	if err != nil {
		return ""
	}
	pid, ok := holders[procfs.LockedFile{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev), Inode: st.Ino}]
	if !ok {
		return ""
	}
	return fmt.Sprintf(" (pid %d)", pid)
}
