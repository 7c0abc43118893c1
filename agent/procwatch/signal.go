package procwatch

import (
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Signal sends sig to the process through its pidfd, so that it can never
// reach another process that reused the pid. A process that has exited
// already is not an error.
func (p *Process) Signal(sig syscall.Signal) error {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); err != nil {
		return err
	}
	if errors.Is(serr, unix.ESRCH) {
		return nil
	}
	return serr
}

// Terminate asks the process to end with SIGTERM and, if it still runs after
// grace, ends it with SIGKILL. It returns once the process has exited, or
// when the Process is closed.
func (p *Process) Terminate(grace time.Duration) error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- p.Wait() }()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case err := <-exited:
		return err
	case <-timer.C:
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	return <-exited
}
