package lease

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
)

// TestWorkedExample is the example of docs/design.md §1.6 run through the engine: stages
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
		testutil.Eventually(t, "reclaimed borrowers gone", func() bool { return h.get("wf1").Reclaiming == 0 })
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
		r, err := h.m.Reservations().Advance(alice, "wf1")
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
	end, err := h.m.Reservations().Advance(alice, "wf1")
	if err != nil || end.State != api.ReservationEnded {
		t.Fatalf("advance past the last stage: %+v, %v", end.ReservationStatus, err)
	}
	if _, err := h.m.Reservations().Get("wf1"); !errors.Is(err, api.ErrNotFound) {
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
	r, err := h.m.Reservations().Advance(alice, "wf")
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
	r, err := h.m.Reservations().Advance(alice, "wf")
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
	r, err := h.m.Reservations().Advance(alice, "wf")
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
	ops := identity.Peer{UID: 1005, GID: 1005, Admin: true}
	if _, err := m.Reservations().Reserve(ops, spec("wf1", []int{1, 2}, member("1005", 0))); err != nil {
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
	if _, err := m.Reservations().Advance(ops, "wf1"); err != nil {
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
	if r, _ := m.Reservations().Get("wf1"); r.InUse+r.Lent != 0 || r.Reserved != 2 {
		t.Fatalf("after the reclaim: %+v", r.ReservationStatus)
	}
}

// TestEndedReservationStopsItsReclaims: a borrower that outlives SIGTERM is
// not killed at the grace's end once the reservation that took it back has
// ended: its lease goes on as a plain one.
func TestEndedReservationStopsItsReclaims(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	h.reserve(alice, spec("wf", []int{1, 3}, member("bob", 0)))
	h.fill()
	g, p := h.mustLease(bob, "", true)
	if !g.Preemptible {
		t.Fatalf("bob's lease %+v is no borrow", g.Lease)
	}
	if r, err := h.m.Reservations().Advance(alice, "wf"); err != nil || r.Reclaiming != 1 {
		t.Fatalf("advance: %+v, %v", r.ReservationStatus, err)
	}
	if err := h.m.Reservations().Unreserve(alice, "wf"); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(10 * time.Second)
	// The timer's goroutine has had its turn.
	time.Sleep(100 * time.Millisecond)
	if got := p.got(); !slices.Equal(got, []syscall.Signal{syscall.SIGTERM}) {
		t.Fatalf("borrower of an ended reservation got %v, want SIGTERM alone", got)
	}
	if _, err := h.m.Get(bob, g.ID); err != nil {
		t.Fatalf("borrowed lease of an ended reservation: %v", err)
	}
}
