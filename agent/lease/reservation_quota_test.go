package lease

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// TestReservedUnitsCountTowardQuotas: what a user's reservations set aside,
// summed over all of them, pending ones included, counts toward the user's
// quotas: no reservation or lease beyond the quota; a draw on the user's own
// reservation adds nothing.
func TestReservedUnitsCountTowardQuotas(t *testing.T) {
	h := newResHarness(t, 1, 8, 1) // 16 units
	h.m.SetRules(placement.New(placement.BestFit), NewQuotas([]config.Quota{{Key: "alice", Kind: identity.User, ID: alice.UID, Limit: 4}}))
	h.reserve(alice, spec("a", []int{2}))
	h.reserve(alice, spec("b", []int{1, 2}))
	_, err := h.m.Reservations().Reserve(alice, spec("c", []int{1}))
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "quota alice: limit 4 unit(s), you hold 0 and reservations set 4 aside") {
		t.Fatalf("a fifth unit reserved: %v", err)
	}
	if _, err := h.m.Acquire(context.Background(), alice, ttlReq(1, "1h")); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("a lease beside 4 reserved units: %v", err)
	}
	// Drawing on her own reservation moves units from reserved to held.
	h.mustLease(alice, "a", false)
	h.mustLease(alice, "a", false)
	if use := h.m.QuotaUse(alice); len(use) != 1 || use[0].Held != 2 || use[0].Reserved != 2 {
		t.Fatalf("QuotaUse = %+v", use)
	}
	// Ending a reservation gives its room back.
	if err := h.m.Reservations().Unreserve(alice, "b"); err != nil {
		t.Fatal(err)
	}
	h.reserve(alice, spec("c", []int{2}))

	// A pending reservation counts as much as an active one.
	h2 := newResHarness(t, 1, 8, 1)
	h2.m.SetRules(placement.New(placement.BestFit), NewQuotas([]config.Quota{{Key: "alice", Kind: identity.User, ID: alice.UID, Limit: 4}}))
	h2.fill()
	pending := spec("p", []int{3})
	pending.Wait = true
	if r := h2.reserve(alice, pending); r.State != api.ReservationPending {
		t.Fatalf("not pending: %+v", r.ReservationStatus)
	}
	more := spec("q", []int{2})
	more.Wait = true
	if _, err := h2.m.Reservations().Reserve(alice, more); !errors.Is(err, api.ErrQuotaExceeded) {
		t.Fatalf("reserved beyond the quota beside a pending reservation: %v", err)
	}
	// Admins are bound by no quota.
	h2.reserve(identity.Peer{UID: 0, Admin: true}, more)
}

// TestPriorityCeiling: a priority above the ceiling needs an admin.
func TestPriorityCeiling(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	high := spec("high", []int{1})
	high.Priority = 1
	if _, err := h.m.Reservations().Reserve(alice, high); !errors.Is(err, api.ErrForbidden) || !strings.Contains(err.Error(), "priority: 1 is above 0") {
		t.Fatalf("priority 1 under the default ceiling: %v", err)
	}
	low := spec("low", []int{1})
	low.Priority = -5
	h.reserve(alice, low)
	h.m.Reservations().SetPriorityCeiling(10)
	high.Priority = 10
	h.reserve(alice, high)
	top := spec("top", []int{1})
	top.Priority = 11
	if _, err := h.m.Reservations().Reserve(bob, top); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("priority 11 under a ceiling of 10: %v", err)
	}
	top.Priority = config.MaxPriority
	h.reserve(identity.Peer{UID: 1005, GID: 1005, Admin: true}, top)
}

// TestReservedUnitsCountTowardGroupsAfterRestart: the units a reservation
// sets aside count toward its owner's groups, supplementary ones included,
// after a restart as before it.
func TestReservedUnitsCountTowardGroupsAfterRestart(t *testing.T) {
	h := newResHarness(t, 1, 8, 1)
	quotas := func() {
		h.m.SetRules(placement.New(placement.BestFit), NewQuotas([]config.Quota{{Key: "group:ml", Kind: identity.Group, ID: 50, Limit: 3}}))
	}
	quotas()
	h.reserve(carol, spec("wf", []int{3})) // carol is in ml by a supplementary group
	erin := identity.Peer{UID: 1004, GID: 1004, Groups: []uint32{50}}
	for _, when := range []string{"before a restart", "after a restart"} {
		if use := h.m.QuotaUse(carol); len(use) != 1 || use[0].Reserved != 3 {
			t.Fatalf("%s: carol's quotas %+v, want group:ml with 3 reserved", when, use)
		}
		if _, err := h.m.Acquire(context.Background(), erin, ttlReq(1, "1h")); !errors.Is(err, api.ErrQuotaExceeded) {
			t.Fatalf("%s: a member leased beyond the group's quota: %v", when, err)
		}
		h.restart()
		quotas()
	}
}
