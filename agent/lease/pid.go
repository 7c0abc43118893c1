package lease

import (
	"errors"
	"fmt"

	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// pidError says why a lease cannot be bound to process pid: asked when the
// request named it ("pid"), admin when the caller may bind to anyone's.
//
// A caller who may not bind to other users' processes gets one message for a
// pid that runs nothing, a thread's id and another user's process alike, so
// that the answer tells nothing about other users' processes (which /proc may
// hide from it, with hidepid).
func pidError(pid int, asked, admin bool, err error) error {
	gone := errors.Is(err, procwatch.ErrGone) || errors.Is(err, procwatch.ErrNotOwner)
	thread := errors.Is(err, procwatch.ErrThread)
	switch {
	case !gone && !thread:
		return fmt.Errorf("cannot watch process %d: %w", pid, err)
	case !asked:
		// The caller's own process, from its connection: it exited after
		// connecting (and its pid may be another's by now).
		return errdefs.Errorf(errdefs.ErrInvalid, "pid: process %d, which connected, is not running", pid)
	case !admin:
		return errdefs.Errorf(errdefs.ErrInvalid, "pid: process %d is not running or is not yours (give a process id, not a thread id)", pid)
	case thread:
		return errdefs.Errorf(errdefs.ErrInvalid, "pid: %d is a thread id, not a process id", pid)
	}
	return errdefs.Errorf(errdefs.ErrInvalid, "pid: process %d is not running", pid)
}
