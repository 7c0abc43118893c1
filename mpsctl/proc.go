package mpsctl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/internal/procfs"
)

// Names the control daemon creates in its pipe folder (see the package comment).
// Only these are ever removed there: the MPS server and clients may keep files of
// their own in the same folder.
const lockFile = "control_lock"

var staleNames = []string{"control", "control_privileged", lockFile, "log"}

// lockHolder returns the pid of the process holding the control daemon's lock in
// pipeDir, or 0 when nobody holds it (or the file does not exist). The control
// daemon writes no pid file; its record lock on control_lock is the one reliable
// trace of it, and the kernel reports the holder's pid in our pid namespace.
func lockHolder(pipeDir string) (int, error) {
	// O_NOFOLLOW: never act through a symlink planted in the folder; O_NONBLOCK: a
	// FIFO under that name must not block the open.
	f, err := os.OpenFile(filepath.Join(pipeDir, lockFile), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	// A symlink (ELOOP) is never the daemon's own lock file: it is stale junk.
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("mpsctl: lock holder: %w", err)
	}
	defer f.Close()
	// A whole-file write lock conflicts with any lock the daemon holds.
	lk := syscall.Flock_t{Type: syscall.F_WRLCK}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil {
		return 0, fmt.Errorf("mpsctl: lock holder of %s: %w", f.Name(), err)
	}
	if lk.Type == syscall.F_UNLCK {
		return 0, nil
	}
	return int(lk.Pid), nil
}

// alive reports whether pid runs. A zombie does not: a control daemon that died is
// a zombie until its parent (init) reaps it, and some inits never do.
func alive(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && !st.Exited()
}

// isOurDaemon reports whether pid runs the control binary at path under our own
// uid. control_lock is writable by everyone, so its lock holder is checked before
// it is killed.
func isOurDaemon(pid int, path string) bool {
	if !procfs.SameExecutable(pid, path) {
		return false
	}
	uid, err := procfs.RealUID(pid)
	return err == nil && uid == uint32(os.Geteuid())
}

// waitGone polls until pid no longer runs, for at most timeout.
func waitGone(ctx context.Context, pid int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for alive(pid) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("mpsctl: pid %d still runs after %v: %w", pid, timeout, ErrTimeout)
		case <-t.C:
		}
	}
	return nil
}

// cleanStale removes what a dead control daemon left in pipeDir: only the known
// names, never a folder, and never through a symlink (Lstat, and unlink removes
// a link itself, not its target).
func cleanStale(pipeDir string) error {
	var errs []error
	for _, name := range staleNames {
		p := filepath.Join(pipeDir, name)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if fi.IsDir() {
			errs = append(errs, fmt.Errorf("mpsctl: %s is a folder, not the control daemon's file", p))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mkdirs creates root/rel one level at a time with mode perm and checks every
// level with Lstat: a symlink there would send the control daemon's sockets and
// cleaning elsewhere. Existing levels are chmod'ed to perm, because the umask may
// have narrowed them and clients of every user must reach the pipe folder.
func mkdirs(root, rel string, perm os.FileMode) error {
	p := root
	for _, elem := range strings.Split(rel, "/") {
		p = filepath.Join(p, elem)
		if err := os.Mkdir(p, perm); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("mpsctl: %w", err)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("mpsctl: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("mpsctl: %s is not a folder (%v)", p, fi.Mode().Type())
		}
		if fi.Mode().Perm() != perm {
			if err := os.Chmod(p, perm); err != nil {
				return fmt.Errorf("mpsctl: %w", err)
			}
		}
	}
	return nil
}
