package lease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/clock"
)

// fakeProcs are processes that exist only for the test: they record the
// signals they get, end at SIGKILL, and at SIGTERM unless they ignore it. A
// pid may be reused by another process (another start time), as the
// kernel's are.
type fakeProcs struct {
	mu    sync.Mutex
	procs map[int]*fakeProc
	next  int
}

type fakeProc struct {
	pid   int
	start uint64
	// uid is its owner: root, or the last uid it was opened as owned by.
	uid        uint32
	ignoreTERM bool
	mu         sync.Mutex
	signals    []syscall.Signal
	// handles counts the handles open on it: what could see it exit.
	handles int
	exited  chan struct{}
	once    sync.Once
}

func newFakeProcs() *fakeProcs { return &fakeProcs{procs: map[int]*fakeProc{}, next: 100000} }

func (f *fakeProcs) spawn(ignoreTERM bool) *fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	p := &fakeProc{pid: f.next, start: uint64(f.next) * 7, ignoreTERM: ignoreTERM, exited: make(chan struct{})}
	f.procs[p.pid] = p
	return p
}

// reuse starts another process with old's pid, old having exited.
func (f *fakeProcs) reuse(old *fakeProc) *fakeProc {
	old.exit()
	f.mu.Lock()
	defer f.mu.Unlock()
	p := &fakeProc{pid: old.pid, start: old.start + 1, exited: make(chan struct{})}
	f.procs[p.pid] = p
	return p
}

func (p *fakeProc) exit() { p.once.Do(func() { close(p.exited) }) }

func (p *fakeProc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// held is the number of handles open on p.
func (p *fakeProc) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.handles
}

func (p *fakeProc) got() []syscall.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.signals)
}

func (f *fakeProcs) open(pid int, start uint64) (Process, uint64, error) {
	f.mu.Lock()
	p := f.procs[pid]
	f.mu.Unlock()
	if p == nil || !p.running() || start != 0 && start != p.start {
		return nil, 0, procwatch.ErrGone
	}
	p.mu.Lock()
	p.handles++
	p.mu.Unlock()
	return &fakeHandle{p: p, closed: make(chan struct{})}, p.start, nil
}

func (f *fakeProcs) Open(pid int, start uint64) (Process, uint64, error) { return f.open(pid, start) }

func (f *fakeProcs) OpenOwned(pid int, uid uint32) (Process, uint64, error) {
	f.mu.Lock()
	p := f.procs[pid]
	f.mu.Unlock()
	if p != nil {
		p.mu.Lock()
		p.uid = uid
		p.mu.Unlock()
	}
	return f.open(pid, 0)
}

func (f *fakeProcs) Adopt(_ *os.File, pid int) (Process, uint64, error) { return f.open(pid, 0) }

// fakeHandle is one hold of a fakeProc, as a pidfd is of a process.
type fakeHandle struct {
	p      *fakeProc
	closed chan struct{}
	once   sync.Once
}

func (h *fakeHandle) Wait() error {
	select {
	case <-h.p.exited:
		return nil
	case <-h.closed:
		return errors.New("closed")
	}
}

func (h *fakeHandle) Signal(sig syscall.Signal) error {
	if !h.p.running() {
		return nil
	}
	h.p.mu.Lock()
	h.p.signals = append(h.p.signals, sig)
	h.p.mu.Unlock()
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM && !h.p.ignoreTERM {
		h.p.exit()
	}
	return nil
}

func (h *fakeHandle) Terminate(time.Duration) error { return h.Signal(syscall.SIGKILL) }

func (h *fakeHandle) Owner() (uint32, error) {
	if !h.p.running() {
		return 0, procwatch.ErrGone
	}
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	return h.p.uid, nil
}

func (h *fakeHandle) Close() error {
	h.once.Do(func() {
		close(h.closed)
		h.p.mu.Lock()
		h.p.handles--
		h.p.mu.Unlock()
	})
	return nil
}

type testAccounts map[string]uint32

func (a testAccounts) LookupUser(name string) (uint32, error) {
	if id, ok := a[name]; ok {
		return id, nil
	}
	return 0, errors.New("unknown user")
}

func (a testAccounts) LookupGroup(name string) (uint32, error) {
	if id, ok := a["group:"+name]; ok {
		return id, nil
	}
	return 0, errors.New("unknown group")
}

var (
	alice = identity.Peer{UID: 1000, GID: 1000}
	bob   = identity.Peer{UID: 1001, GID: 1001}
	carol = identity.Peer{UID: 1002, GID: 1002, Groups: []uint32{50}}
	dave  = identity.Peer{UID: 1003, GID: 1003}
	accts = testAccounts{"alice": 1000, "bob": 1001, "carol": 1002, "dave": 1003, "group:ml": 50}
)

// resHarness runs Managers on one run dir and state dir, with a fake clock
// and fake processes, so that a test can restart the daemon in the middle of
// a stage and see every signal.
type resHarness struct {
	t     *testing.T
	f     *fixture
	m     *Manager
	clock *clock.Fake
	procs *fakeProcs
	path  string
}

func newResHarness(t *testing.T, m, n, k int) *resHarness {
	h := &resHarness{t: t, f: newFixture(t, m, n, k), clock: clock.NewFake(time.Date(2026, 11, 22, 17, 0, 0, 0, time.UTC)),
		procs: newFakeProcs(), path: filepath.Join(t.TempDir(), reserve.FileName)}
	h.start()
	return h
}

func (h *resHarness) start() {
	h.m = h.f.manager(h.t, func(c *Config) {
		c.Clock, c.Processes, c.Accounts = h.clock, h.procs, accts
		c.ReservationsPath, c.ReclaimGrace = h.path, 10*time.Second
	})
}

// restart stops the Manager, as gpuletd's stop does, and starts another.
func (h *resHarness) restart() {
	h.m.Close()
	h.start()
}

func spec(name string, needs []int, share ...reserve.Member) reserve.Spec {
	return reserve.Spec{Name: name, Needs: needs, Share: share}
}

func member(name string, weight int) reserve.Member {
	return reserve.Member{Name: name, Group: strings.HasPrefix(name, "group:"), Weight: weight}
}

func (h *resHarness) reserve(peer identity.Peer, s reserve.Spec) api.Reservation {
	h.t.Helper()
	r, err := h.m.Reservations().Reserve(peer, s)
	if err != nil {
		h.t.Fatalf("reserve %s: %v", s.Name, err)
	}
	return r
}

// lease leases one unit bound to a new fake process of peer's, naming
// reservation res ("" for none), and consenting to borrow. Each lease is made a millisecond after the
// last, so that "newest first" has an order.
func (h *resHarness) lease(peer identity.Peer, res string, ignoreTERM bool) (Grant, *fakeProc, error) {
	h.t.Helper()
	h.clock.Advance(time.Millisecond)
	p := h.procs.spawn(ignoreTERM)
	g, err := h.m.Acquire(context.Background(), peer, Request{LeaseRequest: api.LeaseRequest{Units: 1, PID: p.pid, Reservation: res, Preemptible: true}})
	return g, p, err
}

func (h *resHarness) mustLease(peer identity.Peer, res string, ignoreTERM bool) (Grant, *fakeProc) {
	h.t.Helper()
	g, p, err := h.lease(peer, res, ignoreTERM)
	if err != nil {
		h.t.Fatalf("lease for uid %d on %q: %v", peer.UID, res, err)
	}
	return g, p
}

// fill leases every ordinary free unit to dave, bound to time.
func (h *resHarness) fill() []Grant {
	h.t.Helper()
	var out []Grant
	for {
		g, err := h.m.Acquire(context.Background(), dave, ttlReq(1, "1h"))
		if errors.Is(err, api.ErrInsufficientUnits) {
			return out
		}
		if err != nil {
			h.t.Fatal(err)
		}
		out = append(out, g)
	}
}

func (h *resHarness) get(name string) api.Reservation {
	h.t.Helper()
	r, err := h.m.Reservations().Get(name)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func (h *resHarness) reserved() (n int) {
	for _, g := range h.m.View().GPUs {
		n += g.Reserved
	}
	return n
}

func closeFD(fd int) { syscall.Close(fd) }
