package lease

import (
	"time"

	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// Waiting requests are served in arrival order as each fits, so a smaller one
// passes a larger one that does not fit yet. Under a steady stream of small
// leases a whole-GPU request could wait forever: some unit of every GPU is
// always taken again as soon as it is freed. So once the oldest whole-GPU
// waiter has waited waitHoldAfter, freed units are held for it, as Slurm's
// backfill holds a reservation for its top job: no other request is granted
// ordinary units until it is served, so it gets a GPU as soon as the leases on
// one have ended. The hold is bounded, because what keeps the request out may
// not be other users' leases that end (docs/design.md §6).
const (
	// waitHoldAfter is how long a whole-GPU request waits before freed units
	// are held for it.
	waitHoldAfter = 30 * time.Second
	// waitHoldFor bounds how long one waiter holds them.
	waitHoldFor = 10 * time.Minute
	// waitHoldEvery is the least time between the beginnings of two holds
	// for one user's requests: requests queued one after another hold the
	// node for at most waitHoldFor in every waitHoldEvery.
	waitHoldEvery = time.Hour
)

// holderLocked is the waiter freed units are held for now, or nil: the oldest
// waiting whole-GPU request that has waited at least waitHoldAfter and less
// than waitHoldAfter+waitHoldFor, of a user who holds no units on the node (a
// user cannot stop the node for a GPU that their own leases keep from being
// whole) and for none of whose requests a hold began within waitHoldEvery.
func holderLocked(m *Manager) *waiter {
	now := m.cfg.Clock.Now()
	for _, w := range m.waiters {
		if w.req.GPUs == 0 || w.req.Reservation != "" {
			continue
		}
		waited := now.Sub(w.since)
		if waited < waitHoldAfter {
			// Waiters are in arrival order: later ones waited less.
			return nil
		}
		if waited >= waitHoldAfter+waitHoldFor || m.quotaUse.byUID[w.peer.UID] != 0 {
			continue
		}
		if !w.holding {
			if begun, ok := m.holdsBegun[w.peer.UID]; ok && now.Sub(begun) < waitHoldEvery {
				continue
			}
			for uid, begun := range m.holdsBegun {
				if now.Sub(begun) >= waitHoldEvery {
					delete(m.holdsBegun, uid)
				}
			}
			if m.holdsBegun == nil {
				m.holdsBegun = map[uint32]time.Time{}
			}
			w.holding, m.holdsBegun[w.peer.UID] = true, now
		}
		return w
	}
	return nil
}

// grantLocked grants req as tryGrantLocked does, unless freed units are held
// for a waiter other than self: a draw on a reservation takes no ordinary
// units and is never held up.
func grantLocked(m *Manager, peer identity.Peer, req Request, bind binding, self *waiter) (Grant, error) {
	if h := holderLocked(m); h != nil && h != self && req.Reservation == "" {
		return Grant{}, errdefs.Errorf(errdefs.ErrNoCapacity, "units are held for a whole-GPU request that has waited since %s (a request waits at most %s before freed units are held for it)",
			h.since.UTC().Format(time.RFC3339), waitHoldAfter)
	}
	return m.tryGrantLocked(peer, req, bind)
}
