package lease

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/placement"
	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/e2e"
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
	exited     chan struct{}
	once       sync.Once
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
func (h *fakeHandle) Close() error { h.once.Do(func() { close(h.closed) }); return nil }

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
	alice = Peer{UID: 1000, GID: 1000}
	bob   = Peer{UID: 1001, GID: 1001}
	carol = Peer{UID: 1002, GID: 1002, Groups: []uint32{50}}
	dave  = Peer{UID: 1003, GID: 1003}
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

func (h *resHarness) reserve(peer Peer, s reserve.Spec) api.Reservation {
	h.t.Helper()
	r, err := h.m.Reserve(peer, s)
	if err != nil {
		h.t.Fatalf("reserve %s: %v", s.Name, err)
	}
	return r
}

// lease leases one unit bound to a new fake process of peer's, naming
// reservation res ("" for none), and consenting to borrow. Each lease is made a millisecond after the
// last, so that "newest first" has an order.
func (h *resHarness) lease(peer Peer, res string, ignoreTERM bool) (Grant, *fakeProc, error) {
	h.t.Helper()
	h.clock.Advance(time.Millisecond)
	p := h.procs.spawn(ignoreTERM)
	g, err := h.m.Acquire(context.Background(), peer, Request{LeaseRequest: api.LeaseRequest{Units: 1, PID: p.pid, Reservation: res, Preemptible: true}})
	return g, p, err
}

func (h *resHarness) mustLease(peer Peer, res string, ignoreTERM bool) (Grant, *fakeProc) {
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
	r, err := h.m.Reservation(name)
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

// TestWorkedExample is DESIGN 1.6's example run through the engine: stages
// needing 2, 6, 6, 8 units, with borrowers taking every lendable unit at
// every stage: reserve 8; lendable 6, 2, 2, 0; reclaimed 0, 4, 0, 2. The
// reclaimed borrowers get SIGTERM, and those that ignore it SIGKILL after
// the grace; the owner's draws are never touched.
func TestWorkedExample(t *testing.T) {
	h := newResHarness(t, 1, 8, 1) // 2 GPUs of 8 units
	r := h.reserve(alice, spec("wf1", []int{2, 6, 6, 8}, member("bob", 0)))
	if r.State != api.ReservationActive || r.Reserved != 8 || r.Lendable != 6 || h.reserved() != 8 {
		t.Fatalf("made %+v; %d reserved in the view", r.ReservationStatus, h.reserved())
	}
	if n := len(h.fill()); n != 8 {
		t.Fatalf("%d ordinary units free beside the reservation, want 8", n)
	}
	var owner []*fakeProc
	draw := func(n int) {
		for range n {
			g, p := h.mustLease(alice, "wf1", false)
			if g.Reservation != "wf1" || g.Preemptible {
				t.Fatalf("owner's draw %+v", g.Lease)
			}
			owner = append(owner, p)
		}
	}
	var borrowers []*fakeProc
	// borrow has bob take every lendable unit, without naming the
	// reservation: ordinary units are all taken. The first stubborn ones
	// ignore SIGTERM.
	borrow := func(stubborn int) {
		for {
			g, p, err := h.lease(bob, "", stubborn > 0)
			stubborn--
			if errors.Is(err, api.ErrInsufficientUnits) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g.Reservation != "wf1" || !g.Preemptible {
				t.Fatalf("borrowed lease %+v", g.Lease)
			}
			borrowers = append(borrowers, p)
		}
	}
	var lendable, reclaimed []int
	note := func(r api.Reservation) {
		lendable, reclaimed = append(lendable, r.Lendable), append(reclaimed, r.Reclaimed)
	}
	stage := func(r api.Reservation, stubborn int) {
		note(r)
		// Reclaimed holders end (at SIGTERM, or SIGKILL after the grace).
		h.clock.Advance(10 * time.Second)
		e2e.Eventually(t, "reclaimed borrowers gone", func() bool { return h.get("wf1").Reclaiming == 0 })
		draw(r.Need - h.get("wf1").InUse)
		borrow(stubborn)
		if got := h.get("wf1"); got.Lent != got.Lendable || got.InUse != got.Need || h.reserved() != 0 {
			t.Fatalf("stage %d: %+v, %d idle", got.Stage, got.ReservationStatus, h.reserved())
		}
	}
	// Stage 1 takes back the 4 newest borrowers, stage 3 the 2 oldest:
	// those ignore SIGTERM.
	stage(r, 2)
	for i := range 3 {
		r, err := h.m.Advance(alice, "wf1")
		if err != nil {
			t.Fatal(err)
		}
		if r.Stage != i+1 {
			t.Fatalf("advanced to %+v", r.ReservationStatus)
		}
		stage(r, 0)
	}
	if !slices.Equal(lendable, []int{6, 2, 2, 0}) || !slices.Equal(reclaimed, []int{0, 4, 0, 2}) {
		t.Fatalf("lendable %v, reclaimed %v; want [6 2 2 0], [0 4 0 2]", lendable, reclaimed)
	}
	// Every borrower that was taken back got SIGTERM first; those that
	// ignored it, SIGKILL; the rest got nothing. The owner got nothing.
	var termed, killed, untouched int
	for _, p := range borrowers {
		switch sigs := p.got(); {
		case len(sigs) == 0:
			untouched++
			if !p.running() {
				t.Fatalf("borrower %d ended without a signal", p.pid)
			}
		case slices.Equal(sigs, []syscall.Signal{syscall.SIGTERM}):
			termed++
		case slices.Equal(sigs, []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}):
			killed++
		default:
			t.Fatalf("borrower %d got %v", p.pid, sigs)
		}
	}
	if termed != 4 || killed != 2 || untouched != 0 {
		t.Fatalf("borrowers: %d ended at SIGTERM, %d killed, %d untouched; want 4, 2, 0", termed, killed, untouched)
	}
	for _, p := range owner {
		if len(p.got()) != 0 || !p.running() {
			t.Fatalf("the owner's process %d got %v", p.pid, p.got())
		}
	}
	// Past the last stage the reservation ends; the owner's leases go on.
	end, err := h.m.Advance(alice, "wf1")
	if err != nil || end.State != api.ReservationEnded {
		t.Fatalf("advance past the last stage: %+v, %v", end.ReservationStatus, err)
	}
	if _, err := h.m.Reservation("wf1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("ended reservation still listed: %v", err)
	}
	if got := len(h.m.List(alice)); got != 8 {
		t.Fatalf("the owner holds %d leases after the end, want its 8", got)
	}
}

// TestReclaimFollowsWeights: with weights 1:2, lending splits the lendable
// units 2:4, and a stage that takes 3 back takes 1 from bob and 2 from the
// group's member, each its newest leases first.
func TestReclaimFollowsWeights(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{2, 5, 8}, member("bob", 1), member("group:ml", 2)))
	h.fill()
	var bobs, carols []*fakeProc
	for range 3 {
		if _, p, err := h.lease(bob, "", false); err == nil {
			bobs = append(bobs, p)
		}
	}
	// carol borrows as a member of group ml.
	for range 5 {
		if g, p, err := h.lease(carol, "", false); err == nil {
			if !g.Preemptible {
				t.Fatalf("carol's lease %+v", g.Lease)
			}
			carols = append(carols, p)
		}
	}
	r := h.get("wf")
	if len(bobs) != 2 || len(carols) != 4 || r.LentTo["bob"] != 2 || r.LentTo["group:ml"] != 4 {
		t.Fatalf("bob borrowed %d, carol %d (want 2 and 4); lent_to %v", len(bobs), len(carols), r.LentTo)
	}
	// A member past its share is told so.
	if _, _, err := h.lease(bob, "wf", false); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "lends bob 0 more unit(s)") {
		t.Fatalf("bob past his share: %v", err)
	}
	r, err := h.m.Advance(alice, "wf")
	if err != nil || r.Reclaimed != 3 {
		t.Fatalf("advance: %+v, %v", r.ReservationStatus, err)
	}
	signalled := func(ps []*fakeProc) (out []bool) {
		for _, p := range ps {
			out = append(out, len(p.got()) > 0)
		}
		return out
	}
	if got := signalled(bobs); !slices.Equal(got, []bool{false, true}) {
		t.Errorf("bob's borrowers signalled %v, want his newest one", got)
	}
	if got := signalled(carols); !slices.Equal(got, []bool{false, false, true, true}) {
		t.Errorf("carol's borrowers signalled %v, want her two newest", got)
	}
}

// TestReclaimWithoutWeightsTakesFirstListedFirst: without weights, members
// borrow first come, first served, and a stage takes back from the first
// listed first.
func TestReclaimWithoutWeightsTakesFirstListedFirst(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{2, 4, 8}, member("bob", 0), member("carol", 0)))
	h.fill()
	var bobs, carols []*fakeProc
	for range 2 {
		_, p := h.mustLease(carol, "", false)
		carols = append(carols, p)
	}
	for range 4 {
		_, p := h.mustLease(bob, "", false)
		bobs = append(bobs, p)
	}
	if _, _, err := h.lease(carol, "", false); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("borrowed past what is lendable: %v", err)
	}
	r, err := h.m.Advance(alice, "wf")
	if err != nil || r.Reclaimed != 2 {
		t.Fatalf("advance: %+v, %v", r.ReservationStatus, err)
	}
	for i, p := range carols {
		if len(p.got()) != 0 {
			t.Errorf("carol's borrower %d was signalled; bob is listed first", i)
		}
	}
	n := 0
	for _, p := range bobs {
		if len(p.got()) > 0 {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d of bob's borrowers signalled, want 2", n)
	}
}

// TestBorrowingNeedsOrdinaryUnitsShort: a member's lease takes ordinary
// free units while there are any, and borrows only then; a lease of someone
// outside the share group never borrows.
func TestBorrowingNeedsOrdinaryUnitsShort(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{2, 8}, member("bob", 0)))
	g, _ := h.mustLease(bob, "", false)
	if g.Preemptible || g.Reservation != "" {
		t.Fatalf("a lease with free units about borrowed: %+v", g.Lease)
	}
	h.fill()
	if _, _, err := h.lease(carol, "", false); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("someone outside the share group got units: %v", err)
	}
	if _, _, err := h.lease(carol, "wf", false); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("someone outside the share group leased naming the reservation: %v", err)
	}
	// Borrowing is asked for: a lease that does not say it may be taken
	// back is refused, and told how to borrow.
	req := ttlReq(1, "1h")
	if _, err := h.m.Acquire(context.Background(), bob, req); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), `reservation "wf" lends you units`) {
		t.Fatalf("bob's lease not asking to borrow: %v", err)
	}
	if g, _ := h.mustLease(bob, "", false); !g.Preemptible {
		t.Fatalf("bob's lease with no free units: %+v", g.Lease)
	}
	// Naming the reservation, a member borrows too.
	if g, _ := h.mustLease(bob, "wf", false); !g.Preemptible || g.Reservation != "wf" {
		t.Fatalf("bob's lease naming the reservation: %+v", g.Lease)
	}
	// An admin draws as the owner does.
	if g, _ := h.mustLease(root, "wf", false); g.Preemptible || g.Reservation != "wf" {
		t.Fatalf("an admin's lease naming the reservation: %+v", g.Lease)
	}
}

// TestPriorityAdmission: pending reservations are admitted highest priority
// first, then oldest, as units free; the units freed meanwhile are held for
// the first in line, so that neither a waiting lease nor a stream of new
// small leases can take them.
func TestPriorityAdmission(t *testing.T) {
	h := newResHarness(t, 1, 8, 1) // 16 units
	held := h.fill()
	if len(held) != 16 {
		t.Fatalf("filled %d", len(held))
	}
	low := spec("low", []int{4})
	low.Priority, low.Wait = 1, true
	if r := h.reserve(alice, low); r.State != api.ReservationPending {
		t.Fatalf("low: %+v", r.ReservationStatus)
	}
	high := spec("high", []int{6})
	high.Priority, high.Wait = 5, true
	h.reserve(bob, high)
	late := spec("late", []int{1})
	late.Priority = 5
	if _, err := h.m.Reserve(carol, late); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "1 reservation(s) of higher or equal priority") {
		t.Fatalf("a reservation without wait behind pending ones: %v", err)
	}
	// A lease waiting for a unit, from before any unit frees.
	waited := make(chan error, 1)
	go func() {
		_, err := h.m.Acquire(context.Background(), carol, Request{LeaseRequest: api.LeaseRequest{Units: 1}, TTL: time.Hour, Wait: time.Hour})
		waited <- err
	}()
	e2e.Eventually(t, "the lease to wait", func() bool {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		return len(h.m.waiters) == 1
	})
	release := func(n int) {
		for range n {
			if err := h.m.Release(dave, held[0].ID); err != nil {
				t.Fatal(err)
			}
			held = held[1:]
			// A stream of small leases finds nothing.
			if _, err := h.m.Acquire(context.Background(), carol, ttlReq(1, "1h")); !errors.Is(err, api.ErrInsufficientUnits) {
				t.Fatalf("a small lease took a unit held for a pending reservation: %v", err)
			}
		}
	}
	release(5)
	if r := h.get("high"); r.State != api.ReservationPending || r.Held != 5 || h.get("low").Held != 0 || h.reserved() != 5 {
		t.Fatalf("after 5 freed: high %+v, low held %d, %d reserved", r.ReservationStatus, h.get("low").Held, h.reserved())
	}
	release(1)
	if r := h.get("high"); r.State != api.ReservationActive || r.Reserved != 6 {
		t.Fatalf("high not admitted with 6 freed: %+v", r.ReservationStatus)
	}
	release(4)
	if r := h.get("low"); r.State != api.ReservationActive || r.Reserved != 4 {
		t.Fatalf("low not admitted after high: %+v", r.ReservationStatus)
	}
	select {
	case err := <-waited:
		t.Fatalf("the waiting lease was served before the reservations: %v", err)
	default:
	}
	if err := h.m.Release(dave, held[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiting lease, once both reservations are in: %v", err)
	}
}

// TestEqualPriorityGoesByAge: of two pending reservations of one priority,
// the older is admitted first even when the younger would fit sooner.
func TestEqualPriorityGoesByAge(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	held := h.fill()
	big, small := spec("big", []int{3}), spec("small", []int{1})
	big.Wait, small.Wait = true, true
	h.reserve(alice, big)
	h.reserve(bob, small)
	for i := range 3 {
		if h.get("small").State != api.ReservationPending {
			t.Fatalf("the younger reservation went first after %d freed", i)
		}
		h.m.Release(dave, held[i].ID)
	}
	if h.get("big").State != api.ReservationActive || h.get("small").State != api.ReservationPending {
		t.Fatalf("big %+v, small %+v", h.get("big").ReservationStatus, h.get("small").ReservationStatus)
	}
}

// TestPendingOwnerLeaseWaitsForAdmission: the owner's lease naming a pending
// reservation waits (with "wait") until the reservation is admitted.
func TestPendingOwnerLeaseWaitsForAdmission(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	held := h.fill()
	s := spec("wf", []int{2})
	s.Wait = true
	h.reserve(alice, s)
	if _, _, err := h.lease(alice, "wf", false); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "pending") {
		t.Fatalf("drawing on a pending reservation: %v", err)
	}
	if _, err := h.m.Advance(alice, "wf"); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("advancing a pending reservation: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := h.m.Acquire(context.Background(), alice, Request{LeaseRequest: api.LeaseRequest{Units: 1, Reservation: "wf"}, TTL: time.Hour, Wait: time.Hour})
		got <- err
	}()
	e2e.Eventually(t, "the draw to wait", func() bool {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		return len(h.m.waiters) == 1
	})
	h.m.Release(dave, held[0].ID)
	h.m.Release(dave, held[1].ID)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if r := h.get("wf"); r.InUse != 1 || r.Reserved != 2 {
		t.Fatalf("%+v", r.ReservationStatus)
	}
}

// TestReservationRefusals: bad input and requests of the wrong user get a
// clear error and set nothing aside.
func TestReservationRefusals(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{2, 4}, member("bob", 0)))
	before, _ := os.ReadFile(h.path)
	for _, tc := range []struct {
		name string
		do   func() error
		want error
		msg  string
	}{
		{"stage larger than the node", func() error { _, err := h.m.Reserve(alice, spec("x", []int{2, 17})); return err }, api.ErrBadRequest, "stages[1]: 17 units, more than this node has (16)"},
		{"more than is free", func() error { _, err := h.m.Reserve(alice, spec("x", []int{13})); return err }, api.ErrInsufficientUnits, "only 12 of the 13 unit(s)"},
		{"duplicate name", func() error { _, err := h.m.Reserve(bob, spec("wf", []int{1})); return err }, api.ErrConflict, "exists already"},
		{"unknown user", func() error {
			_, err := h.m.Reserve(alice, spec("x", []int{1}, member("mallory", 0)))
			return err
		}, api.ErrBadRequest, `no user "mallory"`},
		{"unknown group", func() error {
			_, err := h.m.Reserve(alice, spec("x", []int{1}, member("group:ops", 0)))
			return err
		}, api.ErrBadRequest, `no group "ops"`},
		{"another user advances", func() error { _, err := h.m.Advance(bob, "wf"); return err }, api.ErrForbidden, "only its owner and admins"},
		{"another user ends it", func() error { return h.m.Unreserve(carol, "wf") }, api.ErrForbidden, "only its owner and admins"},
		{"unknown reservation", func() error { _, err := h.m.Advance(alice, "nope"); return err }, api.ErrNotFound, `no reservation named "nope"`},
		{"lease on an unknown reservation", func() error { _, _, err := h.lease(alice, "nope", false); return err }, api.ErrNotFound, `reservation: no reservation named "nope"`},
		{"draw more than reserved", func() error {
			for range 5 {
				if _, _, err := h.lease(alice, "wf", false); err != nil {
					return err
				}
			}
			return nil
		}, api.ErrInsufficientUnits, `reservation "wf" has 0 idle unit(s) of 4`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
	if rs := h.m.Reservations(); len(rs) != 1 || rs[0].Reserved != 4 || rs[0].Stage != 0 {
		t.Fatalf("reservations after the refusals: %+v", rs)
	}
	if after, _ := os.ReadFile(h.path); string(after) != string(before) {
		t.Fatalf("a refusal changed the file:\n%s\nthen\n%s", before, after)
	}
	// An admin may advance and end anyone's.
	if _, err := h.m.Advance(root, "wf"); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Unreserve(root, "wf"); err != nil {
		t.Fatal(err)
	}
	if h.reserved() != 0 || len(h.m.Reservations()) != 0 {
		t.Fatal("ended reservation left units set aside")
	}
}

// TestReservationsPerUserAreBounded: one user cannot make the daemon keep
// more than maxReservationsPerUID reservations.
func TestReservationsPerUserAreBounded(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	for i := range maxReservationsPerUID {
		s := spec("r"+string(rune('a'+i)), []int{20 - 4})
		s.Wait = true
		if _, err := h.m.Reserve(bob, s); err != nil {
			t.Fatal(err)
		}
	}
	s := spec("one-more", []int{1})
	s.Wait = true
	if _, err := h.m.Reserve(bob, s); !errors.Is(err, api.ErrTooManyRequests) {
		t.Fatalf("reservation past the cap: %v", err)
	}
	if _, err := h.m.Reserve(alice, s); err != nil {
		t.Fatalf("another user's reservation: %v", err)
	}
}

// TestReservationsSurviveRestarts: a reservation, where its workflow stands
// and which leases borrow from it survive a daemon restart; a reclaim under
// way goes on after one (SIGTERM again, SIGKILL at the same deadline), and a
// borrower that exited meanwhile is not signalled, nor a process that took
// its pid.
func TestReservationsSurviveRestarts(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{2, 6, 8}, member("bob", 0)))
	h.fill()
	h.mustLease(alice, "wf", false)
	var bs []*fakeProc
	for i := range 6 {
		_, p := h.mustLease(bob, "", i < 4) // four ignore SIGTERM
		bs = append(bs, p)
	}
	units := h.get("wf").Units
	h.restart()
	r := h.get("wf")
	if r.State != api.ReservationActive || r.Reserved != 8 || r.Lent != 6 || r.InUse != 1 || !slices.EqualFunc(r.Units, units, func(a, b api.ReservationUnits) bool {
		return a.GPU == b.GPU && slices.Equal(a.Units, b.Units)
	}) {
		t.Fatalf("after a restart: %+v, units %v (were %v)", r.ReservationStatus, r.Units, units)
	}
	// Stage 1 takes back 4: the four newest, two of which ignore SIGTERM.
	r, err := h.m.Advance(alice, "wf")
	if err != nil || r.Reclaimed != 4 || r.Reclaiming != 4 {
		t.Fatalf("advance: %+v, %v", r.ReservationStatus, err)
	}
	// The two that end at SIGTERM give their units back at once.
	e2e.Eventually(t, "two borrowers gone", func() bool { r := h.get("wf"); return r.Reclaiming == 2 && r.Lent == 4 })
	taken := bs[2:]
	for _, p := range taken {
		if !slices.Equal(p.got(), []syscall.Signal{syscall.SIGTERM}) {
			t.Fatalf("borrower %d got %v", p.pid, p.got())
		}
	}
	// While the daemon is down, one of the two still running exits and
	// another process gets its pid.
	h.m.Close()
	reused := h.procs.reuse(taken[0])
	h.clock.Advance(4 * time.Second)
	h.start()
	r = h.get("wf")
	if r.Stage != 1 || r.Reclaimed != 4 || r.Reclaiming != 1 || r.Lent != 3 {
		t.Fatalf("after a restart mid-reclaim: %+v", r.ReservationStatus)
	}
	if len(reused.got()) != 0 {
		t.Fatalf("the process that reused a borrower's pid got %v", reused.got())
	}
	still := taken[1]
	if !slices.Equal(still.got(), []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM}) {
		t.Fatalf("the borrower still there got %v, want SIGTERM again", still.got())
	}
	// SIGKILL comes at the deadline set before the restart: 10s after the
	// advance, 6s from now.
	h.clock.Advance(5 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if !still.running() {
		t.Fatal("killed before its grace ran out")
	}
	h.clock.Advance(time.Second)
	e2e.Eventually(t, "the reclaimed borrower killed", func() bool { return !still.running() })
	e2e.Eventually(t, "its units back", func() bool { r := h.get("wf"); return r.Lent == 2 && r.Reclaiming == 0 })
	if len(reused.got()) != 0 {
		t.Fatalf("the process that reused a borrower's pid got %v", reused.got())
	}
	for _, p := range bs[:2] {
		if len(p.got()) != 0 || !p.running() {
			t.Fatalf("a borrower that was not taken back got %v", p.got())
		}
	}
}

// TestPendingReservationSurvivesRestart: a pending reservation is kept, and
// at start holds again what frees for it.
func TestPendingReservationSurvivesRestart(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	held := h.fill()
	s := spec("wf", []int{3})
	s.Wait, s.Priority = true, 7
	h.reserve(alice, s)
	h.m.Release(dave, held[0].ID)
	h.restart()
	if r := h.get("wf"); r.State != api.ReservationPending || r.Held != 1 || r.Priority != 7 {
		t.Fatalf("after a restart: %+v", r.ReservationStatus)
	}
	h.m.Release(dave, held[1].ID)
	h.m.Release(dave, held[2].ID)
	if r := h.get("wf"); r.State != api.ReservationActive || r.Reserved != 3 {
		t.Fatalf("not admitted: %+v", r.ReservationStatus)
	}
}

// TestDamagedReservationsFileIsSetAside: a file that cannot be read whole is
// moved aside for a look, never written over; the daemon starts without it.
func TestDamagedReservationsFileIsSetAside(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{2}))
	h.m.Close()
	if err := os.WriteFile(h.path, []byte(`{"schema":"gpulet.reservations/v1","reservations":[{"name":`), 0o600); err != nil {
		t.Fatal(err)
	}
	h.start()
	if len(h.m.Reservations()) != 0 || h.reserved() != 0 {
		t.Fatalf("started with %+v", h.m.Reservations())
	}
	b, err := os.ReadFile(h.path + ".damaged")
	if err != nil || !strings.HasSuffix(string(b), `{"name":`) {
		t.Fatalf("damaged file not kept: %q, %v", b, err)
	}
	h.reserve(alice, spec("wf2", []int{2}))
	if b2, _ := os.ReadFile(h.path + ".damaged"); string(b2) != string(b) {
		t.Fatal("the damaged file was written over")
	}
}

// TestUnwritableFileRefusesChanges: when the reservations file cannot be
// written (its folder gone here; a full disk alike), nothing is reserved,
// advanced or ended, and the answer says why; once it can be written, the
// next tick writes it and changes go on.
func TestUnwritableFileRefusesChanges(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{2, 4}))
	dir := filepath.Dir(h.path)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Reserve(alice, spec("x", []int{1})); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "cannot be written") {
		t.Fatalf("reserve with no file: %v", err)
	}
	if _, err := h.m.Advance(alice, "wf"); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("advance with no file: %v", err)
	}
	if err := h.m.Unreserve(alice, "wf"); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("unreserve with no file: %v", err)
	}
	if rs := h.m.Reservations(); len(rs) != 1 || rs[0].Stage != 0 || h.reserved() != 4 {
		t.Fatalf("a refused change changed something: %+v", rs)
	}
	os.MkdirAll(dir, 0o700)
	h.m.Tick()
	if _, err := os.Stat(h.path); err != nil {
		t.Fatalf("tick did not write the file again: %v", err)
	}
	if _, err := h.m.Advance(alice, "wf"); err != nil {
		t.Fatal(err)
	}
}

// TestOfflineClaimOnAReservedUnit: a claimer may take a reserved unit (the
// ledger cannot tell it apart); the unit is used meanwhile, and the
// reservation's again when the claim ends.
func TestOfflineClaimOnAReservedUnit(t *testing.T) {
	h := newResHarness(t, 1, 2, 1) // 2 units per GPU
	r := h.reserve(alice, spec("wf", []int{2}))
	g, u := r.Units[0].GPU, r.Units[0].Units[0]
	fd := claimOffline(t, h.f, g, u)
	e2e.Eventually(t, "the claim counted", func() bool { return h.m.View().GPUs[g].Offline == 1 })
	if v := h.m.View().GPUs[g]; v.Reserved != 1 || v.Used != 1 {
		t.Fatalf("GPU %d with a claim on a reserved unit: %+v", g, v)
	}
	closeFD(fd)
	h.m.probeOffline()
	if v := h.m.View().GPUs[g]; v.Reserved != 2 || v.Used != 0 {
		t.Fatalf("after the claim ended: %+v", v)
	}
}

// TestOtherUsersKeepOutOfAReservationsInstance: with MPS, an instance
// holding a reservation's units serves its owner: another user's ordinary
// lease goes elsewhere, so that the owner's draws are not kept out of it.
func TestOtherUsersKeepOutOfAReservationsInstance(t *testing.T) {
	f := newFixture(t, 1, 4, 2) // 8 units per GPU, 2 instances of 4
	m := f.manager(t, func(c *Config) { c.MPS, c.Accounts, c.Policy = true, accts, "first-fit" })
	r, err := m.Reserve(alice, spec("wf", []int{2}))
	if err != nil {
		t.Fatal(err)
	}
	rg := r.Units[0].GPU
	for range 14 {
		l, err := m.Acquire(context.Background(), bob, ttlReq(1, "1h"))
		if err != nil {
			break
		}
		if l.GPU.Index == rg && l.Instance == 0 {
			t.Fatalf("bob's lease went to the instance of alice's reservation: %+v", l.Lease)
		}
	}
	if _, err := m.Acquire(context.Background(), alice, Request{LeaseRequest: api.LeaseRequest{Units: 1, Reservation: "wf"}, TTL: time.Hour}); err != nil {
		t.Fatalf("alice's draw: %v", err)
	}
}

func closeFD(fd int) { syscall.Close(fd) }

// TestTimeBoundBorrowersJustEnd: a borrowed lease bound to time has no
// process to signal: a stage that takes it back ends it at once.
func TestTimeBoundBorrowersJustEnd(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{2, 8}, member("bob", 0)))
	h.fill()
	var ids []string
	for range 6 {
		req := ttlReq(1, "1h")
		req.Preemptible = true
		g, err := h.m.Acquire(context.Background(), bob, req)
		if err != nil || !g.Preemptible {
			t.Fatalf("bob's ttl borrow: %+v, %v", g.Lease, err)
		}
		ids = append(ids, g.ID)
	}
	r, err := h.m.Advance(alice, "wf")
	if err != nil || r.Reclaimed != 6 || r.Lent != 0 || r.Reclaiming != 0 {
		t.Fatalf("advance: %+v, %v", r.ReservationStatus, err)
	}
	for _, id := range ids {
		if _, err := h.m.Get(bob, id); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("reclaimed ttl lease %s: %v", id, err)
		}
	}
	// Their ends are in the journal: a restart does not bring them back.
	h.restart()
	if r := h.get("wf"); r.Lent != 0 || r.Reserved != 8 {
		t.Fatalf("after a restart: %+v", r.ReservationStatus)
	}
}

// TestReservationKeepsToItsOwnersPools: a reservation sets aside units only
// on GPUs its owner may lease from: its owner's draws are placed through
// the pools, so units set aside on a pool the owner may not use could
// never be drawn on, and would be kept from the pool's own users.
func TestReservationKeepsToItsOwnersPools(t *testing.T) {
	h := newResHarness(t, 1, 4, 1) // 2 GPUs of 4 units
	h.m.SetRules(placement.New(placement.BestFit).WithPools([]config.Pool{
		{Name: "training", GPUs: []int{0}, UIDs: []uint32{alice.UID}},
	}), nil)
	r := h.reserve(bob, spec("wf1", []int{2}))
	for _, u := range r.Units {
		if u.GPU == 0 {
			t.Fatalf("bob's reservation set aside units %v of GPU 0, in pool training, which bob may not use", u.Units)
		}
	}
	if _, _, err := h.lease(bob, "wf1", false); err != nil {
		t.Fatalf("bob cannot draw on his own reservation: %v", err)
	}
	// More than the GPUs bob may use have: it cannot be set aside.
	if _, err := h.m.Reserve(bob, spec("wf2", []int{4})); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("reserving beyond bob's pools: %v", err)
	}
	// alice, in the pool, still has GPU 0 whole.
	for range 4 {
		if _, _, err := h.lease(alice, "", false); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReclaimNeverSignalsAnotherUsersProcess: an admin-group member who is
// not root may bind a lease to anyone's process ("pid"); when that lease is
// a borrow, a reclaim must not make gpuletd, which runs as root, signal a
// process its lease owner could not signal itself. The lease ends instead.
func TestReclaimNeverSignalsAnotherUsersProcess(t *testing.T) {
	f := newFixture(t, 1, 2, 1) // 2 GPUs of 2 units
	m := f.manager(t, func(c *Config) {
		c.Accounts = accts
		c.ReservationsPath = filepath.Join(t.TempDir(), reserve.FileName)
		c.ReclaimGrace = time.Hour
	})
	ops := Peer{UID: 1005, GID: 1005, Admin: true}
	if _, err := m.Reserve(ops, spec("wf1", []int{1, 2}, member("1005", 0))); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := m.Acquire(context.Background(), dave, ttlReq(1, "1h")); err != nil {
			break
		}
	}
	// A process that is not ops's: this test's user's (root).
	victim := exec.Command("sleep", "300")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { victim.Wait(); close(exited) }()
	t.Cleanup(func() { victim.Process.Kill(); <-exited })
	g, err := m.Acquire(context.Background(), ops, Request{LeaseRequest: api.LeaseRequest{Units: 1, PID: victim.Process.Pid, Preemptible: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !g.Preemptible {
		t.Fatalf("not a borrow: %+v", g.Lease)
	}
	if _, err := m.Advance(ops, "wf1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatalf("reclaiming uid %d's borrow signalled process %d, which is not uid %d's", ops.UID, victim.Process.Pid, ops.UID)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := m.Get(root, g.ID); err == nil {
		t.Fatalf("the borrow %s was not taken back", g.ID)
	}
	if r, _ := m.Reservation("wf1"); r.InUse+r.Lent != 0 || r.Reserved != 2 {
		t.Fatalf("after the reclaim: %+v", r.ReservationStatus)
	}
}

// TestPendingReservationAdmittedAtStartKeepsToPools: a pending reservation
// taken back at start may be admitted then (units freed while gpuletd was
// down), before anything else runs: the engine it is placed with must be
// the configured one, pools included, not a bare one.
func TestPendingReservationAdmittedAtStartKeepsToPools(t *testing.T) {
	h := newResHarness(t, 1, 4, 1) // 2 GPUs of 4 units
	pools := placement.New(placement.BestFit).WithPools([]config.Pool{
		{Name: "training", GPUs: []int{0}, UIDs: []uint32{alice.UID}},
	})
	h.m.SetRules(pools, nil)
	h.fill()
	if r, err := h.m.Reserve(bob, reserve.Spec{Name: "wf1", Needs: []int{2}, Wait: true}); err != nil || r.State != api.ReservationPending {
		t.Fatalf("reserve: %+v, %v", r, err)
	}
	// dave's leases run out while gpuletd is down.
	h.m.Close()
	h.clock.Advance(2 * time.Hour)
	h.m = h.f.manager(t, func(c *Config) {
		c.Clock, c.Processes, c.Accounts = h.clock, h.procs, accts
		c.ReservationsPath, c.ReclaimGrace = h.path, 10*time.Second
		c.Engine = pools
	})
	r := h.get("wf1")
	if r.State != api.ReservationActive {
		t.Fatalf("not admitted at start: %+v", r.ReservationStatus)
	}
	for _, u := range r.Units {
		if u.GPU == 0 {
			t.Fatalf("admitted at start on units %v of GPU 0, in pool training, which bob may not use", u.Units)
		}
	}
}

// TestReservationThatCouldNeverBeUsedIsRefused: a reservation larger than the
// GPUs its owner's pools hold, or than a quota that binds its owner, is
// refused at once even with wait: it would otherwise hold units from
// everyone for nothing.
func TestReservationThatCouldNeverBeUsedIsRefused(t *testing.T) {
	h := newResHarness(t, 1, 4, 1) // 2 GPUs of 4 units
	h.m.SetRules(placement.New(placement.BestFit).WithPools([]config.Pool{
		{Name: "training", GPUs: []int{0}, UIDs: []uint32{alice.UID}},
	}), NewQuotas([]config.Quota{{Key: "alice", Kind: config.User, ID: alice.UID, Limit: 3}}))
	wait := spec("big", []int{5})
	wait.Wait = true
	_, err := h.m.Reserve(bob, wait)
	if !errors.Is(err, api.ErrInsufficientUnits) || !errors.Is(err, placement.ErrNeverFits) || !strings.Contains(err.Error(), "the GPUs you may use hold 4") {
		t.Fatalf("bob's 5 units where he may use 4: %v", err)
	}
	_, err = h.m.Reserve(alice, spec("q", []int{4}))
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "quota alice: limit 3 unit(s), less than the 4") {
		t.Fatalf("alice's 4 units over her quota of 3: %v", err)
	}
	if rs := h.m.Reservations(); len(rs) != 0 || h.reserved() != 0 {
		t.Fatalf("something was set aside: %+v", rs)
	}
	// Within both, it is made.
	h.reserve(alice, spec("ok", []int{3}))
}
