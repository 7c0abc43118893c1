// Package procwatch tells when a process exits, without polling and without
// being fooled by a reused pid: it holds a pidfd, which names one process for
// good, and checks the process's start time against the one recorded with a
// lease. It also says whose a process is (OpenOwned) in a way a reused pid
// cannot fool. It does not decide who may bind to what: the lease manager does.
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

// ErrThread means the id names a thread that does not lead its process: a
// lease is bound to a process, and pidfd_open takes only a process's id.
var ErrThread = errors.New("id is a thread's, not a process's")

// ErrNotOwner means the process belongs to another user than the one asked.
var ErrNotOwner = errors.New("process belongs to another user")

// MaxPID bounds process ids: the kernel's pid_max is at most 4194304
// (PID_MAX_LIMIT on 64-bit), and pids are below it. A pid_t is 32 bits, so a
// larger number would otherwise be cut to another pid on its way into a
// syscall.
const MaxPID = 1<<22 - 1

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

// realUID is the real uid of process pid. The owner of its /proc folder is
// not it: that is the effective uid, or root for a process that is not
// dumpable.
func realUID(pid int) (uint32, error) {
	uid, err := procfs.RealUID(pid)
	if errors.Is(err, procfs.ErrNoProcess) {
		return 0, ErrGone
	}
	if err != nil {
		return 0, fmt.Errorf("procwatch: %w", err)
	}
	return uid, nil
}

// Process is one watched process.
type Process struct {
	f   *os.File
	pid int
}

// Open takes hold of process pid, checking that it is the process that started
// at startTime (0: whatever process has the pid now). The pidfd is taken first
// and the start time read after, so that the check is about the held process.
func Open(pid int, startTime uint64) (*Process, uint64, error) {
	fd, err := pidfdOpen(pid)
	if err != nil {
		return nil, 0, err
	}
	return hold(fd, pid, startTime)
}

// OpenOwned takes hold of process pid if its real uid is uid, and fails with
// ErrNotOwner otherwise. The pidfd is taken first, the owner and start time
// read from /proc after, and the held process then checked to be still alive:
// a live process keeps its pid, so what /proc said was about it, not about a
// process that got the pid after it died.
func OpenOwned(pid int, uid uint32) (*Process, uint64, error) {
	fd, err := pidfdOpen(pid)
	if err != nil {
		return nil, 0, err
	}
	owner, err := realUID(pid)
	if err == nil && owner != uid {
		err = ErrNotOwner
	}
	if err != nil {
		unix.Close(fd)
		return nil, 0, err
	}
	return hold(fd, pid, 0)
}

// Adopt takes hold of the process that pidfd f holds, whose pid is pid (the
// pid and the pidfd that SO_PEERCRED and SO_PEERPIDFD give for one
// connection). It keeps a duplicate: the caller still owns and closes f. A
// process that has exited since, which such a pidfd may still name, is
// ErrGone.
func Adopt(f *os.File, pid int) (*Process, uint64, error) {
	if pid <= 0 || pid > MaxPID {
		return nil, 0, ErrGone
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, 0, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, 0, err
	}
	if derr != nil {
		return nil, 0, fmt.Errorf("procwatch: duplicating the pidfd of %d: %w", pid, derr)
	}
	return hold(fd, pid, 0)
}

func pidfdOpen(pid int) (int, error) {
	if pid <= 0 || pid > MaxPID {
		// No process has such an id.
		return -1, ErrGone
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	switch {
	case errors.Is(err, unix.ESRCH):
		return -1, ErrGone
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		// The pid and flags are valid, so the kernel found a thread that is
		// not its process's leader (EINVAL on older kernels, ENOENT on newer).
		return -1, ErrThread
	case err != nil:
		return -1, fmt.Errorf("procwatch: pidfd_open %d: %w", pid, err)
	}
	return fd, nil
}

// hold checks that pidfd fd, for pid, holds a live process that started at
// startTime (0: any) and wraps it; it closes fd on failure.
func hold(fd, pid int, startTime uint64) (*Process, uint64, error) {
	st, err := StartTime(pid)
	if err == nil && startTime != 0 && st != startTime {
		err = ErrGone
	}
	if err == nil {
		err = alive(fd)
	}
	if err == nil {
		// A non-blocking pidfd joins the runtime's poller, so waiting on it
		// takes no thread. (A pidfd from SO_PEERPIDFD comes blocking.)
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		unix.Close(fd)
		return nil, 0, err
	}
	return &Process{f: os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid)), pid: pid}, st, nil
}

// Owner is the process's real uid now, read from /proc and then checked, as
// OpenOwned does, against the held process being still alive: what /proc said
// was about it, not about a process that got its pid after it died. A
// process that has exited is ErrGone.
func (p *Process) Owner() (uint32, error) {
	uid, err := realUID(p.pid)
	if err != nil {
		return 0, err
	}
	rc, err := p.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var aerr error
	if err := rc.Control(func(fd uintptr) { aerr = alive(int(fd)) }); err != nil {
		return 0, err
	}
	return uid, aerr
}

// alive reports whether the process pidfd fd holds still runs: signal 0 checks
// without sending. EPERM still means it exists.
func alive(fd int) error {
	err := unix.PidfdSendSignal(fd, 0, nil, 0)
	switch {
	case err == nil, errors.Is(err, unix.EPERM):
		return nil
	case errors.Is(err, unix.ESRCH):
		return ErrGone
	}
	return fmt.Errorf("procwatch: pidfd_send_signal: %w", err)
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
