package lease

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/clock"
)

// Kind names what ends a lease. It is journaled with the lease (api.Lease's
// Binding), so that a restart binds it the same way again.
type Kind string

// The binding kinds. Leases of pods and reservation draws will be further
// kinds: each is one binding type below, and nothing else in the engine needs
// to know it.
const (
	// KindPID: the lease ends when its process exits.
	KindPID Kind = "pid"
	// KindTTL: the lease ends unless renewed within its ttl.
	KindTTL Kind = "ttl"
)

// binding is what ends a lease and what it holds meanwhile (a pidfd, a timer).
type binding interface {
	kind() Kind
	// armLocked starts watching for the end of lease l.
	armLocked(m *Manager, l *lease)
	// release lets go of what the binding holds; the lease's end is then no
	// longer watched. Safe to call more than once.
	release()
}

// Process is a process a lease is bound to, held so that a reused pid is
// never taken for it: its exit ends the lease, and it can be signalled (a
// reclaim ends a borrower with SIGTERM, then SIGKILL after a grace).
type Process interface {
	// Wait returns nil when the process exits, an error when closed first.
	Wait() error
	Signal(sig syscall.Signal) error
	Terminate(grace time.Duration) error
	Close() error
}

// Processes opens processes to bind leases to.
type Processes interface {
	// Open takes hold of process pid that started at startTime (0: whichever
	// has the pid now) and returns its start time.
	Open(pid int, startTime uint64) (Process, uint64, error)
}

// pidfdProcesses is the real Processes: procwatch's pidfds.
type pidfdProcesses struct{}

func (pidfdProcesses) Open(pid int, startTime uint64) (Process, uint64, error) {
	p, st, err := procwatch.Open(pid, startTime)
	if err != nil {
		return nil, 0, err
	}
	return p, st, nil
}

// procKey names one process across pid reuse.
type procKey struct {
	pid       int
	startTime uint64
}

// pidBinding ends a lease when its process exits.
type pidBinding struct {
	proc      Process
	pid       int
	startTime uint64
}

func (b *pidBinding) kind() Kind { return KindPID }

func (b *pidBinding) armLocked(m *Manager, l *lease) {
	p, id := b.proc, l.ID
	go func() {
		if p.Wait() == nil {
			m.end(id, "process exited")
		}
	}()
}

func (b *pidBinding) release() {
	if b.proc != nil {
		b.proc.Close()
	}
}

func (b *pidBinding) key() procKey { return procKey{b.pid, b.startTime} }

// ttlBinding ends a lease unless it is renewed within ttl.
type ttlBinding struct {
	ttl      time.Duration
	deadline time.Time
	timer    clock.Timer
}

func (b *ttlBinding) kind() Kind { return KindTTL }

func (b *ttlBinding) armLocked(m *Manager, l *lease) {
	if b.timer != nil {
		b.timer.Stop()
	}
	id := l.ID
	b.timer = m.clock.AfterFunc(b.deadline.Sub(m.clock.Now()), func() { m.expire(id) })
}

func (b *ttlBinding) release() {
	if b.timer != nil {
		b.timer.Stop()
	}
}

// bindingFor decides what the lease will be bound to and takes hold of the
// process.
func (m *Manager) bindingFor(peer Peer, req Request) (binding, error) {
	if req.TTL > 0 {
		return &ttlBinding{ttl: req.TTL}, nil
	}
	pid := peer.PID
	if req.PID != 0 {
		pid = req.PID
	}
	// The pidfd first: the owner check below is then about the held process,
	// not whatever the pid names by then.
	p, st, err := m.cfg.Processes.Open(pid, 0)
	if err != nil {
		if errors.Is(err, procwatch.ErrGone) {
			return nil, api.Errorf(api.ErrBadRequest, "pid: process %d is not running", pid)
		}
		return nil, fmt.Errorf("cannot watch process %d: %w", pid, err)
	}
	if req.PID != 0 && !peer.Admin && peer.UID != 0 {
		uid, err := procwatch.OwnerUID(pid)
		if err == nil {
			// Still the process the pidfd holds (same start time after the
			// look), so uid is its owner.
			var now uint64
			if now, err = procwatch.StartTime(pid); err == nil && now != st {
				err = procwatch.ErrGone
			}
		}
		if err != nil {
			p.Close()
			return nil, api.Errorf(api.ErrBadRequest, "pid: process %d is not running", pid)
		}
		if uid != peer.UID {
			p.Close()
			return nil, api.Errorf(api.ErrForbidden, "pid: process %d belongs to another user", pid)
		}
	}
	return &pidBinding{proc: p, pid: pid, startTime: st}, nil
}
