package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
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
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another gpuletd is already running with --run-dir %s", runDir)
		}
		return nil, fmt.Errorf("--run-dir: locking %s: %w", path, err)
	}
	return f.Close, nil
}
