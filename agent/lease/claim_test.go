package lease

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/errdefs"
)

func shareOf(uid, device string, gpu, instance, units int, user uint32) ClaimShare {
	return ClaimShare{
		Claim: api.LeaseClaim{Namespace: "ns", Name: "claim-" + uid, UID: uid, Device: device, Share: "s-" + uid},
		GPU:   gpu, Instance: instance, Units: units, UID: user, GID: user,
	}
}

// A claim lease lies on the instance the scheduler chose, is the same lease
// when asked again, survives a restart and ends by EndClaim.
func TestClaimLeaseOnTheAllocatedInstance(t *testing.T) {
	f := newFixture(t, 4, 2, 2) // 16 units per GPU, instances {0-7} and {8-15}
	m1 := f.manager(t)
	s := shareOf("u1", "gpu-1-mps-1", 1, 1, 3, 1000)
	g, reused, err := m1.Claims().GrantClaim(s)
	if err != nil || reused {
		t.Fatalf("GrantClaim: %v (reused %v)", err, reused)
	}
	if g.Binding != "claim" || g.GPU.Index != 1 || g.Instance != 1 || len(g.Units) != 3 || g.Units[0] < 8 || g.Owner.UID != 1000 {
		t.Fatalf("lease %+v", g.Lease)
	}
	if g.Claim == nil || g.Claim.UID != "u1" || g.Env["CUDA_VISIBLE_DEVICES"] != f.devs[1].UUID {
		t.Fatalf("claim %+v env %v", g.Claim, g.Env)
	}
	again, reused, err := m1.Claims().GrantClaim(s)
	if err != nil || !reused || again.ID != g.ID {
		t.Fatalf("asked again: %v reused %v id %s, want %s", err, reused, again.ID, g.ID)
	}
	if _, err := m1.Renew(root, g.ID); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "ResourceClaim") {
		t.Fatalf("renewing a claim lease: %v", err)
	}
	m1.Close()

	m2 := f.manager(t)
	again, reused, err = m2.Claims().GrantClaim(s)
	if err != nil || !reused || again.ID != g.ID || again.Claim == nil || again.Claim.Device != "gpu-1-mps-1" {
		t.Fatalf("after restart: %+v reused %v err %v", again.Lease, reused, err)
	}
	if n := m2.Claims().EndClaim("u1", "unprepared"); n != 1 {
		t.Fatalf("EndClaim ended %d leases", n)
	}
	if n := m2.Claims().EndClaim("u1", "unprepared"); n != 0 {
		t.Fatalf("EndClaim twice ended %d more", n)
	}
	for _, u := range g.Units {
		if f.ledger.Present(1, u) {
			t.Fatal("an ended claim lease left its pipe files")
		}
	}
}

// An MPS server serves one user: a claim of another user on an instance that
// a user holds is refused, and the same user's is granted beside it. A whole
// GPU takes every unit and is refused while a share holds one.
func TestClaimOneUserPerInstanceAndWholeGPUs(t *testing.T) {
	f := newFixture(t, 4, 2, 2)
	m := f.manager(t, func(c *Config) { c.MPS = true })
	if _, _, err := m.Claims().GrantClaim(shareOf("a", "gpu-0-mps-0", 0, 0, 2, 1000)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Claims().GrantClaim(shareOf("b", "gpu-0-mps-0", 0, 0, 2, 2000)); err == nil {
		t.Fatal("a second user's claim was granted on an instance another user holds")
	}
	if _, _, err := m.Claims().GrantClaim(shareOf("c", "gpu-0-mps-0", 0, 0, 2, 1000)); err != nil {
		t.Fatalf("the same user's second claim: %v", err)
	}
	if _, _, err := m.Claims().GrantClaim(shareOf("d", "gpu-0-mps-1", 0, 1, 2, 2000)); err != nil {
		t.Fatalf("another user on the other instance: %v", err)
	}
	if _, _, err := m.Claims().GrantClaim(shareOf("w", "gpu-0", 0, -1, 0, 3000)); err == nil {
		t.Fatal("a whole GPU was granted while shares hold its units")
	}
	w, _, err := m.Claims().GrantClaim(shareOf("w", "gpu-1", 1, -1, 0, 3000))
	if err != nil || len(w.GPUs) != 1 || len(w.Units) != 16 {
		t.Fatalf("whole GPU 1: %+v %v", w.Lease, err)
	}
	if _, _, err := m.Claims().GrantClaim(shareOf("e", "gpu-1-mps-0", 1, 0, 1, 3000)); err == nil {
		t.Fatal("a share was granted on a GPU leased whole")
	}
	if _, _, err := m.Claims().GrantClaim(ClaimShare{Claim: api.LeaseClaim{UID: "x", Device: "d"}, GPU: 5, Instance: 0, Units: 1}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a GPU the node lacks: %v", err)
	}
}
