package lease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/internal/testutil"
)

// TestPriorityAdmission: pending reservations are admitted highest priority
// first, then oldest, as units free; the units freed meanwhile are held for
// the first in line, so that neither a waiting lease nor a stream of new
// small leases can take them.
func TestPriorityAdmission(t *testing.T) {
	h := newResHarness(t, 1, 8, 1) // 16 units
	// Users may ask any priority here, as the config allows.
	h.m.Reservations().SetPriorityCeiling(config.MaxPriority)
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
	if _, err := h.m.Reservations().Reserve(carol, late); !errors.Is(err, api.ErrInsufficientUnits) || !strings.Contains(err.Error(), "1 reservation(s) of higher or equal priority") {
		t.Fatalf("a reservation without wait behind pending ones: %v", err)
	}
	// A lease waiting for a unit, from before any unit frees.
	waited := make(chan error, 1)
	go func() {
		_, err := h.m.Acquire(context.Background(), carol, Request{LeaseRequest: api.LeaseRequest{Units: 1}, TTL: time.Hour, Wait: time.Hour})
		waited <- err
	}()
	testutil.Eventually(t, "the lease to wait", func() bool {
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

// TestEqualPriorityGoesByAgeAcrossRestarts: a restart keeps the order of
// pending reservations of one priority: the older, whatever its name, holds
// what frees and is admitted first.
func TestEqualPriorityGoesByAgeAcrossRestarts(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	held := h.fill()
	older, younger := spec("zz", []int{3}), spec("aa", []int{1})
	older.Wait, younger.Wait = true, true
	h.reserve(alice, older)
	h.clock.Advance(time.Second)
	h.reserve(bob, younger)
	h.m.Release(dave, held[0].ID)
	h.restart()
	if zz, aa := h.get("zz"), h.get("aa"); zz.Held != 1 || aa.State != api.ReservationPending {
		t.Fatalf("after a restart the younger went first: zz %+v, aa %+v", zz.ReservationStatus, aa.ReservationStatus)
	}
	h.m.Release(dave, held[1].ID)
	h.m.Release(dave, held[2].ID)
	if zz, aa := h.get("zz"), h.get("aa"); zz.State != api.ReservationActive || aa.State != api.ReservationPending {
		t.Fatalf("zz %+v, aa %+v", zz.ReservationStatus, aa.ReservationStatus)
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
	if _, err := h.m.Reservations().Advance(alice, "wf"); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("advancing a pending reservation: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := h.m.Acquire(context.Background(), alice, Request{LeaseRequest: api.LeaseRequest{Units: 1, Reservation: "wf"}, TTL: time.Hour, Wait: time.Hour})
		got <- err
	}()
	testutil.Eventually(t, "the draw to wait", func() bool {
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
		{"stage larger than the node", func() error { _, err := h.m.Reservations().Reserve(alice, spec("x", []int{2, 17})); return err }, api.ErrBadRequest, "stages[1]: 17 units, more than this node has (16)"},
		{"more than is free", func() error { _, err := h.m.Reservations().Reserve(alice, spec("x", []int{13})); return err }, api.ErrInsufficientUnits, "only 12 of the 13 unit(s)"},
		{"duplicate name", func() error { _, err := h.m.Reservations().Reserve(bob, spec("wf", []int{1})); return err }, api.ErrConflict, "exists already"},
		{"unknown user", func() error {
			_, err := h.m.Reservations().Reserve(alice, spec("x", []int{1}, member("mallory", 0)))
			return err
		}, api.ErrBadRequest, `no user "mallory"`},
		{"unknown group", func() error {
			_, err := h.m.Reservations().Reserve(alice, spec("x", []int{1}, member("group:ops", 0)))
			return err
		}, api.ErrBadRequest, `no group "ops"`},
		{"another user advances", func() error { _, err := h.m.Reservations().Advance(bob, "wf"); return err }, api.ErrForbidden, "only its owner and admins"},
		{"another user ends it", func() error { return h.m.Reservations().Unreserve(carol, "wf") }, api.ErrForbidden, "only its owner and admins"},
		{"unknown reservation", func() error { _, err := h.m.Reservations().Advance(alice, "nope"); return err }, api.ErrNotFound, `no reservation named "nope"`},
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
	if rs := h.m.Reservations().List(); len(rs) != 1 || rs[0].Reserved != 4 || rs[0].Stage != 0 {
		t.Fatalf("reservations after the refusals: %+v", rs)
	}
	if after, _ := os.ReadFile(h.path); string(after) != string(before) {
		t.Fatalf("a refusal changed the file:\n%s\nthen\n%s", before, after)
	}
	// An admin may advance and end anyone's.
	if _, err := h.m.Reservations().Advance(root, "wf"); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Reservations().Unreserve(root, "wf"); err != nil {
		t.Fatal(err)
	}
	if h.reserved() != 0 || len(h.m.Reservations().List()) != 0 {
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
		if _, err := h.m.Reservations().Reserve(bob, s); err != nil {
			t.Fatal(err)
		}
	}
	s := spec("one-more", []int{1})
	s.Wait = true
	if _, err := h.m.Reservations().Reserve(bob, s); !errors.Is(err, api.ErrTooManyRequests) {
		t.Fatalf("reservation past the cap: %v", err)
	}
	if _, err := h.m.Reservations().Reserve(alice, s); err != nil {
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
	r, err := h.m.Reservations().Advance(alice, "wf")
	if err != nil || r.Reclaimed != 4 || r.Reclaiming != 4 {
		t.Fatalf("advance: %+v, %v", r.ReservationStatus, err)
	}
	// The two that end at SIGTERM give their units back at once.
	testutil.Eventually(t, "two borrowers gone", func() bool { r := h.get("wf"); return r.Reclaiming == 2 && r.Lent == 4 })
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
	// advance, 6s from now. The kill is a timer of the fake clock, which
	// fires only when the time passes its deadline: a move of 5s that fires
	// no timer has started no kill.
	timers := h.clock.Pending()
	h.clock.Advance(5 * time.Second)
	if n := h.clock.Pending(); n != timers || !still.running() {
		t.Fatalf("killed before its grace ran out: %d of %d timers left, running %v, signals %v", n, timers, still.running(), still.got())
	}
	h.clock.Advance(time.Second)
	testutil.Eventually(t, "the reclaimed borrower killed", func() bool { return !still.running() })
	testutil.Eventually(t, "its units back", func() bool { r := h.get("wf"); return r.Lent == 2 && r.Reclaiming == 0 })
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
	h.m.Reservations().SetPriorityCeiling(config.MaxPriority)
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
	if len(h.m.Reservations().List()) != 0 || h.reserved() != 0 {
		t.Fatalf("started with %+v", h.m.Reservations().List())
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
	if _, err := h.m.Reservations().Reserve(alice, spec("x", []int{1})); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "cannot be written") {
		t.Fatalf("reserve with no file: %v", err)
	}
	if _, err := h.m.Reservations().Advance(alice, "wf"); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("advance with no file: %v", err)
	}
	if err := h.m.Reservations().Unreserve(alice, "wf"); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("unreserve with no file: %v", err)
	}
	if rs := h.m.Reservations().List(); len(rs) != 1 || rs[0].Stage != 0 || h.reserved() != 4 {
		t.Fatalf("a refused change changed something: %+v", rs)
	}
	os.MkdirAll(dir, 0o700)
	h.m.Tick()
	if _, err := os.Stat(h.path); err != nil {
		t.Fatalf("tick did not write the file again: %v", err)
	}
	if _, err := h.m.Reservations().Advance(alice, "wf"); err != nil {
		t.Fatal(err)
	}
}
