package lease

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/reserve"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/placement"
)

// TestOfflineClaimOnAReservedUnit: a claimer may take a reserved unit (the
// ledger cannot tell it apart); the unit is used meanwhile, and the
// reservation's again when the claim ends.
func TestOfflineClaimOnAReservedUnit(t *testing.T) {
	h := newResHarness(t, 1, 2, 1) // 2 units per GPU
	r := h.reserve(alice, spec("wf", []int{2}))
	g, u := r.Units[0].GPU, r.Units[0].Units[0]
	fd := claimOffline(t, h.f, g, u)
	testutil.Eventually(t, "the claim counted", func() bool { return h.m.View().GPUs[g].Offline == 1 })
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
	r, err := m.Reservations().Reserve(alice, spec("wf", []int{2}))
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

// TestReservationKeepsToItsOwnersPools: a reservation sets aside units only
// on GPUs its owner may lease from: its owner's draws are placed through
// the pools, so units set aside on a pool the owner may not use could
// never be drawn on, and would be kept from the pool's own users.
func TestReservationKeepsToItsOwnersPools(t *testing.T) {
	h := newResHarness(t, 1, 4, 1) // 2 GPUs of 4 units
	h.m.SetRules(placement.New(placement.BestFit).WithPools([]placement.Pool{
		{Name: "training", GPUs: []int{0}, Set: identity.Set{UIDs: []uint32{alice.UID}}},
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
	if _, err := h.m.Reservations().Reserve(bob, spec("wf2", []int{4})); !errors.Is(err, api.ErrInsufficientUnits) {
		t.Fatalf("reserving beyond bob's pools: %v", err)
	}
	// alice, in the pool, still has GPU 0 whole.
	for range 4 {
		if _, _, err := h.lease(alice, "", false); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPendingReservationAdmittedAtStartKeepsToPools: a pending reservation
// taken back at start may be admitted then (units freed while gpuletd was
// down), before anything else runs: the engine it is placed with must be
// the configured one, pools included, not a bare one.
func TestPendingReservationAdmittedAtStartKeepsToPools(t *testing.T) {
	h := newResHarness(t, 1, 4, 1) // 2 GPUs of 4 units
	pools := placement.New(placement.BestFit).WithPools([]placement.Pool{
		{Name: "training", GPUs: []int{0}, Set: identity.Set{UIDs: []uint32{alice.UID}}},
	})
	h.m.SetRules(pools, nil)
	h.fill()
	if r, err := h.m.Reservations().Reserve(bob, reserve.Spec{Name: "wf1", Needs: []int{2}, Wait: true}); err != nil || r.State != api.ReservationPending {
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
	h.m.SetRules(placement.New(placement.BestFit).WithPools([]placement.Pool{
		{Name: "training", GPUs: []int{0}, Set: identity.Set{UIDs: []uint32{alice.UID}}},
	}), NewQuotas([]config.Quota{{Key: "alice", Kind: identity.User, ID: alice.UID, Limit: 3}}))
	wait := spec("big", []int{5})
	wait.Wait = true
	_, err := h.m.Reservations().Reserve(bob, wait)
	if !errors.Is(err, api.ErrInsufficientUnits) || !errors.Is(err, placement.ErrNeverFits) || !strings.Contains(err.Error(), "the GPUs you may use hold 4") {
		t.Fatalf("bob's 5 units where he may use 4: %v", err)
	}
	_, err = h.m.Reservations().Reserve(alice, spec("q", []int{4}))
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "quota alice: limit 3 unit(s), less than the 4") {
		t.Fatalf("alice's 4 units over her quota of 3: %v", err)
	}
	if rs := h.m.Reservations().List(); len(rs) != 0 || h.reserved() != 0 {
		t.Fatalf("something was set aside: %+v", rs)
	}
	// Within both, it is made.
	h.reserve(alice, spec("ok", []int{3}))
}
