// Package procwatch tells when a process exits, without polling and without
// being fooled by a reused pid: it holds a pidfd, which names one process for
// good, and checks the process's start time against the one recorded with a
// lease.
package procwatch

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/procfs"
)

// ErrGone means the process does not exist, or the pid now names another
// process than the one recorded.
var ErrGone = errors.New("process is gone")

// StartTime is the process's start time in clock ticks since boot: with the
// pid, it names one process across pid reuse. A zombie has none: it is gone.
func StartTime(pid int) (uint64, error) {
	st, err := procfs.ReadStat(pid)
	if errors.Is(err, procfs.ErrNoProcess) || err == nil && st.Exited() {
		return 0, ErrGone
	}
	if err != nil {
		return 0, fmt.Errorf("procwatch: %w", err)
	}
	return st.StartTime, nil
}

// OwnerUID is the real uid of process pid.
func OwnerUID(pid int) (uint32, error) {
	uid, err := procfs.RealUID(pid)
	if err != nil {
		return 0, ErrGone
	}
	return uid, nil
}

// Process is one watched process.
type Process struct {
	f *os.File
}

// Open takes hold of process pid, checking that it is the process that started
// at startTime (0: whatever process has the pid now). The pidfd is taken first
// and the start time read after, so that the check is about the held process.
func Open(pid int, startTime uint64) (*Process, uint64, error) {
	if pid <= 0 {
		return nil, 0, fmt.Errorf("procwatch: invalid pid %d", pid)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, 0, ErrGone
	}
	if err != nil {
		return nil, 0, fmt.Errorf("procwatch: pidfd_open %d: %w", pid, err)
	}
	st, err := StartTime(pid)
	if err == nil && startTime != 0 && st != startTime {
		err = ErrGone
	}
	if err != nil {
		unix.Close(fd)
		return nil, 0, err
	}
	// A non-blocking pidfd joins the runtime's poller, so waiting on it takes no
	// thread.
	return &Process{f: os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))}, st, nil
}

// Wait blocks until the process exits or Close is called. It returns nil on exit
// and an error when closed.
func (p *Process) Wait() error {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	var exited bool
	err = rc.Read(func(fd uintptr) bool {
		// A pidfd becomes readable when its process exits; until then, returning
		// false parks this goroutine on the poller.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, perr := unix.Poll(pfd, 0)
		exited = perr == nil && n > 0
		return exited
	})
	if exited {
		return nil
	}
	if err == nil {
		err = errors.New("procwatch: wait ended")
	}
	return err
}

// Close stops watching; a Wait under way returns an error.
func (p *Process) Close() error { return p.f.Close() }
