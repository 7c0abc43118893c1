package lease

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/placement"
)

// TestCheapHoldsLockNoNode is the attack of one user holding one unit on
// every MPS instance of a 4-GPU node (4 to 8 units of 64), through ttl
// leases or offline claims: before, every other user was refused with 60
// units free. Now each user's holds keep others off only as many instances
// as their units fill, so another user still gets units, and not on the
// instance the first user keeps.
func TestCheapHoldsLockNoNode(t *testing.T) {
	cases := []struct {
		name    string
		m, n, k int // the unit model: U = 16, K instances of 16/K units
		policy  placement.Policy
		offline bool
	}{
		{name: "K=1, ttl leases", m: 4, n: 4, k: 1, policy: placement.BestFit},
		// Spread puts a user's second lease on a GPU on its other instance,
		// so ttl leases alone reach every instance.
		{name: "K=2, ttl leases under spread", m: 2, n: 4, k: 2, policy: placement.Spread},
		{name: "K=2, offline claims", m: 2, n: 4, k: 2, policy: placement.BestFit, offline: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			model, err := units.New(c.m, c.n, c.k, 0)
			if err != nil {
				t.Fatal(err)
			}
			f := fixtureOf(t, runDir(t), model, inventory.Models[0], inventory.Models[0], inventory.Models[0], inventory.Models[0])
			m := f.manager(t, func(cfg *Config) {
				cfg.MPS = true
				cfg.InstanceEnv = mpsFolders(f, "/p")
				cfg.Policy = c.policy
			})
			// Offline claims belong to their FIFO's owner: the test's own uid.
			attacker := identity.Peer{UID: uint32(os.Getuid()), Admin: true}
			victim := identity.Peer{UID: attacker.UID + 4242, Admin: true}
			size := model.UnitsPerGPU / c.k
			for g := range f.devs {
				for k := range c.k {
					if c.offline {
						fd := claimOffline(t, f, g, k*size)
						t.Cleanup(func() { unix.Close(fd) })
						continue
					}
					r := ttlReq(1, "720h")
					r.GPU = strconv.Itoa(g)
					if _, err := m.Acquire(context.Background(), attacker, r); err != nil {
						t.Fatal(err)
					}
				}
			}
			testutil.Eventually(t, "the attacker's units counted", func() bool {
				v := m.View()
				for _, gv := range v.GPUs {
					for _, iv := range gv.Instances {
						if len(iv.Users) != 1 || iv.Users[0] != attacker.UID {
							return false
						}
					}
				}
				return true
			})
			l, err := m.Acquire(context.Background(), victim, ttlReq(c.m, "1m"))
			if err != nil {
				t.Fatalf("another user refused with %d of %d units held by one user: %v", len(f.devs)*c.k, len(f.devs)*model.UnitsPerGPU, err)
			}
			if l.GPU.Index == 0 && l.Instance == 0 {
				t.Fatalf("the victim was put on the instance the attacker keeps: %+v", l)
			}
			// The attacker keeps one instance: the victim's next lease does
			// not go there, and the attacker's does.
			for range c.k*len(f.devs) - 1 {
				l, err := m.Acquire(context.Background(), victim, ttlReq(1, "1m"))
				if err != nil {
					break
				}
				if l.GPU.Index == 0 && l.Instance == 0 {
					t.Fatalf("the victim was put on the instance the attacker keeps: %+v", l)
				}
			}
			r := ttlReq(1, "1m")
			r.GPU = "0"
			if l, err := m.Acquire(context.Background(), attacker, r); err != nil {
				t.Fatalf("the attacker on GPU 0: %+v %v", l, err)
			}
		})
	}
}

// TestClaimOnAnotherUsersInstanceIsSwept: with MPS, an offline claim made by
// hand on an instance that another user keeps is flagged in the log, with
// its owner, and its FIFO removed, so the unit is free again; one on an
// instance that serves nobody else, or where the other user's holds are
// surplus, stays.
func TestClaimOnAnotherUsersInstanceIsSwept(t *testing.T) {
	f := newFixture(t, 2, 4, 2) // 2 instances of 8 units per GPU
	var log testutil.SyncBuffer
	m := f.manager(t, func(c *Config) {
		c.MPS = true
		c.InstanceEnv = mpsFolders(f, "/p")
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
	})
	other := identity.Peer{UID: uint32(os.Getuid()) + 4242, Admin: true}
	r := ttlReq(1, "1h")
	r.GPU = "0"
	l, err := m.Acquire(context.Background(), other, r)
	if err != nil || l.Instance != 0 {
		t.Fatalf("lease %+v, %v", l, err)
	}
	fd := claimOffline(t, f, 0, 1) // instance 0: the other user's
	defer unix.Close(fd)
	testutil.Eventually(t, "the claim swept", func() bool { return !f.ledger.Present(0, 1) && m.View().GPUs[0].Offline == 0 })
	if !strings.Contains(log.String(), "offline claim on an MPS instance that serves another user removed") || !strings.Contains(log.String(), "uid="+strconv.Itoa(os.Getuid())) {
		t.Fatalf("not flagged with its owner:\n%s", log.String())
	}
	fd2 := claimOffline(t, f, 0, 8) // instance 1: nobody's
	defer unix.Close(fd2)
	testutil.Eventually(t, "the claim counted", func() bool { return m.View().GPUs[0].Offline == 1 })
	// The other user's second lease on GPU 1 makes their hold there
	// surplus (2 units on two instances of 8): a claim beside it stays.
	r.GPU = "1"
	if l, err = m.Acquire(context.Background(), other, r); err != nil {
		t.Fatal(err)
	}
	fd3 := claimOffline(t, f, l.GPU.Index, l.Units[0]^1)
	defer unix.Close(fd3)
	testutil.Eventually(t, "the claim beside a surplus hold counted", func() bool { return m.View().GPUs[1].Offline == 1 })
	m.Tick()
	if !f.ledger.Present(0, 8) || !f.ledger.Present(l.GPU.Index, l.Units[0]^1) {
		t.Fatal("a claim that intrudes on nobody was removed")
	}
}
