package lease

import (
	"os"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/identity"
)

// Kind names what ends a lease. It is journaled with the lease (api.Lease's
// Binding), so that a restart binds it the same way again.
type Kind string

// The binding kinds. Leases of pods will be a further kind: each is one
// binding type below, and nothing else in the engine needs to know it. (A
// lease drawn on or borrowed from a reservation is bound like any other;
// where its units come from is reservation.go's.)
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
	// Owner is the process's real uid now.
	Owner() (uint32, error)
	Close() error
}

// Processes opens processes to bind leases to. Each returns the process's
// start time with it.
type Processes interface {
	// Open takes hold of process pid that started at startTime (0: whichever
	// has the pid now).
	Open(pid int, startTime uint64) (Process, uint64, error)
	// OpenOwned takes hold of process pid if it belongs to uid.
	OpenOwned(pid int, uid uint32) (Process, uint64, error)
	// Adopt takes hold of the process pidfd holds, whose pid is pid.
	Adopt(pidfd *os.File, pid int) (Process, uint64, error)
}

// pidfdProcesses is the real Processes: procwatch's pidfds.
type pidfdProcesses struct{}

func (pidfdProcesses) Open(pid int, startTime uint64) (Process, uint64, error) {
	return held(procwatch.Open(pid, startTime))
}

func (pidfdProcesses) OpenOwned(pid int, uid uint32) (Process, uint64, error) {
	return held(procwatch.OpenOwned(pid, uid))
}

func (pidfdProcesses) Adopt(pidfd *os.File, pid int) (Process, uint64, error) {
	return held(procwatch.Adopt(pidfd, pid))
}

// held turns procwatch's answer into the interface's, keeping a failure's
// Process a nil interface.
func held(p *procwatch.Process, st uint64, err error) (Process, uint64, error) {
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
			m.exited(id)
		}
	}()
}

func (b *pidBinding) release() {
	if b.proc != nil {
		b.proc.Close()
	}
}

func (b *pidBinding) key() procKey { return procKey{b.pid, b.startTime} }

// bindingFor decides what the lease will be bound to and takes hold of the
// process: the caller's own (through the pidfd of its connection where the
// kernel gives one), or the one "pid" names, which must be the caller's
// unless it is an admin.
func (m *Manager) bindingFor(peer identity.Peer, req Request) (binding, error) {
	if req.TTL > 0 {
		return newTTLBinding(req.TTL, time.Time{}), nil
	}
	if req.Slurm != "" {
		return m.slurm.bindingFor(peer, req.Slurm)
	}
	pid, admin := peer.PID, peer.Admin || peer.UID == 0
	var p Process
	var st uint64
	var err error
	procs := m.cfg.Processes
	switch {
	case req.PID != 0 && admin:
		pid = req.PID
		p, st, err = procs.Open(pid, 0)
	case req.PID != 0:
		pid = req.PID
		p, st, err = procs.OpenOwned(pid, peer.UID)
	case peer.PIDFD != nil:
		p, st, err = procs.Adopt(peer.PIDFD, pid)
	default:
		// Without SO_PEERPIDFD the pid may name another process than the
		// one that connected; it must at least be the caller's user's.
		p, st, err = procs.OpenOwned(pid, peer.UID)
	}
	if err != nil {
		return nil, pidError(pid, req.PID != 0, admin, err)
	}
	return &pidBinding{proc: p, pid: pid, startTime: st}, nil
}
