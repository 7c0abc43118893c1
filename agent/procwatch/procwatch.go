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
	"strings"

	"golang.org/x/sys/unix"
)

// ErrGone means the process does not exist, or the pid now names another
// process than the one recorded.
var ErrGone = errors.New("process is gone")

// StartTime is the process's start time in clock ticks since boot (field 22 of
// /proc/<pid>/stat): with the pid, it names one process across pid reuse.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, ErrGone
		}
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: count fields
	// after the last ')'.
	s := string(b)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, fmt.Errorf("procwatch: malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[end+1:])
	// fields[0] is field 3 (state); start time is field 22.
	if len(fields) < 20 {
		return 0, fmt.Errorf("procwatch: malformed /proc/%d/stat", pid)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, ErrGone
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// OwnerUID is the real uid of process pid.
func OwnerUID(pid int) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid), &st); err != nil {
		return 0, ErrGone
	}
	return st.Uid, nil
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
